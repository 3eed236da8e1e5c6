"""Inputs every entry point must refuse, with an error that names the argument.

One table of bad inputs runs against every entry point that takes the argument: the compiled
ops (lattice_loss, logits_to_lattice, rnnt_loss, joint_lattice, flash_rnnt_loss),
samplewise_rnnt_loss and, for the lengths they validate, the reference losses. Each case runs
eagerly and in a tf.function whose input_signature leaves every dimension unknown, so checks
that need values or shapes run in the graph. Statically detectable problems raise ValueError;
the rest raise InvalidArgumentError when the graph runs. Either way the message must name the
argument (and show the offending value where the case says so).
"""

import inspect

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import DEVICES, compile_for

import tf_rnnt
from tf_rnnt import _contract as contract
from tf_rnnt import reference

B, T, U, H, V = 2, 4, 2, 3, 7
GRAPH_MODES = ["eager", "function_dynamic_shapes"]

# Entry point -> (function, its tensor arguments in order, the options it takes).
_JOINT_INPUTS = ("encoder", "predictor", "kernel", "bias", "labels", "logit_lengths",
                 "label_lengths")
ENTRY_POINTS = {
    "lattice_loss": (tf_rnnt.lattice_loss, ("lattice", "logit_lengths", "label_lengths"),
                     {"fastemit_lambda", "clamp"}),
    "logits_to_lattice": (tf_rnnt.logits_to_lattice, ("logits", "labels"), {"blank"}),
    "rnnt_loss": (tf_rnnt.rnnt_loss, ("logits", "labels", "logit_lengths", "label_lengths"),
                  {"blank", "fastemit_lambda", "clamp"}),
    "joint_lattice": (tf_rnnt.joint_lattice, _JOINT_INPUTS,
                      {"blank", "activation", "mode", "tile_size", "memory_budget"}),
    "flash_rnnt_loss": (tf_rnnt.flash_rnnt_loss, _JOINT_INPUTS,
                        {"blank", "activation", "mode", "tile_size", "memory_budget",
                         "fastemit_lambda", "clamp"}),
    "samplewise_rnnt_loss": (
        lambda *a, **o: tf_rnnt.samplewise_rnnt_loss(*a, parallel_iterations=o.pop(
            "parallel_iterations", 1), **o),
        _JOINT_INPUTS,
        {"blank", "activation", "memory_budget", "fastemit_lambda", "parallel_iterations"}),
    "reference.lattice_loss": (reference.lattice_loss,
                               ("lattice", "logit_lengths", "label_lengths"),
                               {"fastemit_lambda", "clamp"}),
    "reference.rnnt_loss": (reference.rnnt_loss,
                            ("logits", "labels", "logit_lengths", "label_lengths"),
                            {"blank", "fastemit_lambda", "clamp"}),
    "reference.flash_rnnt_loss": (reference.flash_rnnt_loss, _JOINT_INPUTS,
                                  {"blank", "activation", "fastemit_lambda", "clamp"}),
}
REFERENCES = {"reference.lattice_loss", "reference.rnnt_loss", "reference.flash_rnnt_loss"}
# Label values are only checked by the losses of the joint ops and of full logits.
NOT_LABEL_CHECKERS = REFERENCES | {"logits_to_lattice"}
LABEL_CHECKERS = {e for e in ENTRY_POINTS if "labels" in ENTRY_POINTS[e][1]} - NOT_LABEL_CHECKERS


def _valid_args():
    rng = np.random.default_rng(40)
    args = dict(
        encoder=rng.normal(size=(B, T, H)).astype(np.float32),
        predictor=rng.normal(size=(B, U + 1, H)).astype(np.float32),
        kernel=rng.normal(size=(H, V)).astype(np.float32),
        bias=rng.normal(size=(V,)).astype(np.float32),
        labels=np.array([[1, 2], [3, 1]], np.int32),
        logit_lengths=np.array([4, 3], np.int32),
        label_lengths=np.array([2, 1], np.int32),
    )
    args["logits"] = oracle.joint_logits(args["encoder"], args["predictor"], args["kernel"],
                                         args["bias"]).astype(np.float32)
    args["lattice"] = oracle.lattice_from_logits(args["logits"], args["labels"]).astype(
        np.float32)
    return args


def _set(array, index, value, dtype=None):
    array = np.array(array, dtype)
    array[index] = value
    return array


def _concat(axis=0):
    return lambda a: np.concatenate([a, np.take(a, [0], axis)], axis)


# (case id, argument, change, names the message must mention (any one), offending value the
# message must show or None, entry points it does not apply to; None: the references, which
# check lengths, options and int64 overflow but not shapes, dtypes or label values)
TENSOR_CASES = (
    [
        (
            "label_ge_V",
            "labels",
            lambda a: _set(a, (0, 1), 23),
            ("labels",),
            "23",
            NOT_LABEL_CHECKERS,
        ),
        (
            "label_negative",
            "labels",
            lambda a: _set(a, (1, 0), -3),
            ("labels",),
            "-3",
            NOT_LABEL_CHECKERS,
        ),
        (
            "label_is_blank",
            "labels",
            lambda a: _set(a, (0, 0), 0),
            ("labels",),
            None,
            NOT_LABEL_CHECKERS,
        ),
        (
            "logit_length_zero",
            "logit_lengths",
            lambda a: _set(a, 1, 0),
            ("logit_lengths",),
            None,
            (),
        ),
        (
            "logit_length_negative",
            "logit_lengths",
            lambda a: _set(a, 1, -2),
            ("logit_lengths",),
            None,
            (),
        ),
        (
            "logit_length_above_T",
            "logit_lengths",
            lambda a: _set(a, 0, 41),
            ("logit_lengths",),
            None,
            (),
        ),
        (
            "label_length_negative",
            "label_lengths",
            lambda a: _set(a, 0, -5),
            ("label_lengths",),
            None,
            (),
        ),
        (
            "label_length_above_U",
            "label_lengths",
            lambda a: _set(a, 1, 37),
            ("label_lengths",),
            None,
            (),
        ),
        ("logit_lengths_batch", "logit_lengths", _concat(), ("logit_lengths",), None, ()),
        ("label_lengths_batch", "label_lengths", lambda a: a[:1], ("label_lengths",), None, ()),
        # int64 values beyond int32 must not wrap around in a cast (2**32 + 3 would read as 3).
        (
            "logit_length_int64_overflow",
            "logit_lengths",
            lambda a: _set(a, 1, 2**32 + 3, np.int64),
            ("logit_lengths",),
            None,
            (),
        ),
        (
            "label_length_int64_overflow",
            "label_lengths",
            lambda a: _set(a, 1, 2**32 + 1, np.int64),
            ("label_lengths",),
            None,
            (),
        ),
        (
            "label_int64_overflow",
            "labels",
            lambda a: _set(a, (0, 0), 2**32 + 1, np.int64),
            ("labels",),
            None,
            (),
        ),
        ("labels_batch", "labels", _concat(), ("labels",), None, None),
        (
            "labels_vs_states",
            "labels",
            lambda a: a[:, :1],
            ("labels", "predictor", "logits"),
            None,
            None,
        ),
        ("kernel_rows_vs_H", "kernel", _concat(), ("kernel",), None, None),
        ("bias_vs_V", "bias", _concat(), ("bias",), None, None),
        ("empty_vocabulary", "kernel", lambda a: a[:, :0], ("kernel", "bias"), None, None),
        (
            "empty_vocabulary_logits",
            "logits",
            lambda a: a[..., :0],
            ("logits", "blank", "labels"),
            None,
            None,
        ),
        ("predictor_H", "predictor", lambda a: a[..., :2], ("predictor", "encoder"), None, None),
        ("predictor_batch", "predictor", _concat(), ("predictor",), None, None),
        # The compiled joint takes one dtype for all four tensors; samplewise casts each.
        (
            "kernel_dtype_vs_encoder",
            "kernel",
            lambda a: a.astype(np.float16),
            ("kernel",),
            None,
            REFERENCES | {"samplewise_rnnt_loss"},
        ),
        ("lattice_channels", "lattice", _concat(-1), ("lattice",), None, None),
    ]
    + [
        (f"{name}_rank", name, lambda a: a[0] if a.ndim > 1 else a[None], (name,), None, None)
        for name in (
            "lattice",
            "logits",
            "encoder",
            "predictor",
            "kernel",
            "bias",
            "labels",
            "logit_lengths",
            "label_lengths",
        )
    ]
    + [
        (
            f"{name}_{np.dtype(dtype).name}",
            name,
            lambda a, dtype=dtype: a.astype(dtype),
            (name,),
            None,
            None,
        )
        for name, dtypes in (
            ("lattice", (np.float64, np.int32)),
            ("logits", (np.float64, np.int32)),
            ("encoder", (np.float64, np.int32)),
            ("predictor", (np.float64,)),
            ("kernel", (np.float64,)),
            ("bias", (np.float64,)),
            ("labels", (np.float32,)),
            ("logit_lengths", (np.float32,)),
            ("label_lengths", (np.float64,)),
        )
        for dtype in dtypes
    ]
)


def _applies(case, entry):
    _, arg, _, _, _, excluded = case
    if arg not in ENTRY_POINTS[entry][1]:
        return False
    return entry not in (REFERENCES if excluded is None else excluded)


TENSOR_PARAMS = [pytest.param(entry, case, id=f"{entry}-{case[0]}")
                 for case in TENSOR_CASES for entry in ENTRY_POINTS if _applies(case, entry)]

# (option, bad value, the value the message must show or None)
OPTION_CASES = [
    ("blank", V, "7"), ("blank", -V - 1, "-8"), ("blank", 100, "100"), ("blank", 0.7, None),
    ("blank", True, None), ("blank", 2**32, None), ("blank", np.float64(1.0), None),
    ("fastemit_lambda", -1.0, None), ("fastemit_lambda", float("nan"), None),
    ("fastemit_lambda", float("inf"), None), ("fastemit_lambda", True, None),
    ("clamp", float("nan"), None),
    ("activation", "gelu", None), ("mode", "fast", None),
    ("tile_size", 0, None), ("tile_size", -4, None), ("tile_size", True, None),
    ("tile_size", 2**63, None), ("tile_size", 1.5, None), ("tile_size", np.float32(8), None),
    ("memory_budget", 0, None), ("memory_budget", -1, None), ("memory_budget", True, None),
    ("parallel_iterations", 0, None), ("parallel_iterations", "fast", None),
    ("parallel_iterations", True, None),
]
OPTION_PARAMS = [pytest.param(entry, option, value, shown,
                              id=f"{entry}-{option}={value!r}")
                 for option, value, shown in OPTION_CASES for entry in ENTRY_POINTS
                 if option in ENTRY_POINTS[entry][2]]


def _call(entry, args, options, graph_mode):
    fn, names, _ = ENTRY_POINTS[entry]
    tensors = [tf.constant(args[name]) for name in names]
    call = compile_for(lambda *values: fn(*values, **options), graph_mode, tensors)
    result = call(*tensors)
    return result.numpy()


def _assert_names(error, names, value=None):
    message = str(error)
    assert any(name in message for name in names), f"error names none of {names}: {message}"
    if value is not None:
        assert value in message, f"error does not show the offending value {value}: {message}"


@pytest.mark.parametrize("graph_mode", GRAPH_MODES)
@pytest.mark.parametrize("entry,case", TENSOR_PARAMS)
@pytest.mark.parametrize("device", DEVICES)
def test_bad_tensor(entry, case, graph_mode, device):
    _, arg, change, names, value, _ = case
    args = _valid_args()
    args[arg] = change(args[arg])
    with tf.device(device):
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as info:
            _call(entry, args, {}, graph_mode)
    _assert_names(info.value, names, value)


@pytest.mark.parametrize("graph_mode", GRAPH_MODES)
@pytest.mark.parametrize("entry,option,value,shown", OPTION_PARAMS)
def test_bad_option(entry, option, value, shown, graph_mode):
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as info:
        _call(entry, _valid_args(), {option: value}, graph_mode)
    _assert_names(info.value, [option], shown)


@pytest.mark.parametrize("entry", [e for e in ENTRY_POINTS if "blank" in ENTRY_POINTS[e][2]])
@pytest.mark.parametrize("device", DEVICES)
def test_blank_checked_against_run_time_vocabulary(entry, device):
    # With every dimension unknown, blank = V is only found out of range when the graph runs.
    with tf.device(device):
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            _call(entry, _valid_args(), {"blank": V}, "function_dynamic_shapes")
    _assert_names(info.value, ["blank"], "7")


@pytest.mark.parametrize("entry", sorted(LABEL_CHECKERS))
@pytest.mark.parametrize("graph_mode", GRAPH_MODES)
def test_label_equal_to_negative_blank(entry, graph_mode):
    # blank = -1 is V - 1 = 6: a label 6 within label_lengths is the blank index.
    args = _valid_args()
    args["labels"] = _set(args["labels"], (1, 0), V - 1)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        _call(entry, args, {"blank": -1}, graph_mode)
    _assert_names(info.value, ["labels"])


@pytest.mark.parametrize("option,value", [("tile_size", np.int64(5)),
                                          ("memory_budget", np.int32(1 << 20)),
                                          ("blank", np.int64(-1))])
@pytest.mark.parametrize("entry", ["joint_lattice", "flash_rnnt_loss"])
def test_numpy_integer_options_are_accepted(entry, option, value):
    args = _valid_args()
    if option == "blank":
        args["labels"] = _set(args["labels"], (0, 0), 2)  # V - 1 is now blank, 1 a label
    expected = _call(entry, args, {option: int(value)}, "eager")
    np.testing.assert_array_equal(_call(entry, args, {option: value}, "eager"), expected)


@pytest.mark.parametrize("entry", ["lattice_loss", "rnnt_loss", "flash_rnnt_loss",
                                   "samplewise_rnnt_loss", "reference.rnnt_loss"])
def test_int64_lengths_and_labels_in_range_are_accepted(entry):
    args = _valid_args()
    expected = _call(entry, args, {}, "eager")
    for name in ("labels", "logit_lengths", "label_lengths"):
        args[name] = args[name].astype(np.int64)
    for graph_mode in GRAPH_MODES:
        np.testing.assert_allclose(_call(entry, args, {}, graph_mode), expected, rtol=1e-6)


@pytest.mark.parametrize("entry", sorted(contract.OP_INPUTS))
def test_declared_inputs_match_the_signatures(entry):
    fn = getattr(tf_rnnt, entry)
    names = tuple(inspect.signature(fn).parameters)[:len(contract.OP_INPUTS[entry])]
    assert names == contract.OP_INPUTS[entry]
    if entry in ENTRY_POINTS and entry != "samplewise_rnnt_loss":
        assert ENTRY_POINTS[entry][1] == contract.OP_INPUTS[entry]
