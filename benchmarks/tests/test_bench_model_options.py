"""benchmarks/bench_model.py's options, its encoder FLOP count, the tfasr variant's fallback and
the results file and table it writes, on the CPU without subprocesses (the end-to-end --tiny run
is benchmarks/tests/test_bench_model.py)."""

import importlib.util
import json
import os

import numpy as np
import pytest

_BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REPO_ROOT = os.path.dirname(_BENCHMARKS)


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load("bench_model_options_under_test", os.path.join(_BENCHMARKS, "bench_model.py"))


def test_lists_aliases_and_tiny_defaults():
    args = bench.parse_args(["--vocab", "1025,4097", "--jit-compile", "false,true",
                             "--variants", "flash,untiled,tfasr"])
    assert args.vocabs == [1025, 4097] and args.jit_list == ["false", "true"]
    assert args.variant_list == ["flash", "flash-untiled", "tfasr"]
    assert bench.parse_args([]).variant_list == ["flash", "flash-untiled", "logits", "tfasr"]
    assert bench.parse_args([]).timeout >= 600  # a full-model XLA compile takes minutes
    tiny = bench.parse_args(["--tiny"])
    assert tiny.vocabs == [17] and tiny.matmul_size == 256 and tiny.d_model == 32
    assert bench.parse_args(["--tiny", "--vocab", "9,33"]).vocabs == [9, 33]
    for bad in (["--variants", "flash,warp"], ["--jit-compile", "yes"], ["--vocab", "1"],
                ["--dtypes", "float16"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_driver_flags_stay_with_the_driver():
    argv = ["--tiny", "--save", "--json", "r.json", "--vocab=17,33", "--jit-compile", "true",
            "--steps", "3", "--out", "x.md"]
    assert bench._driver_argv(argv) == ["--tiny", "--steps", "3"]


@pytest.mark.parametrize("name, slug", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB",
                                                                  "a100"),
    (None, "cpu"), ("-", "cpu")])
def test_gpu_slug(name, slug):
    assert bench.gpu_slug(name) == slug


def _brute_force_encoder_flops(sizes, batch, frames_in):
    """Builds the encoder and runs it once, counting 2 FLOPs per multiply-add of every
    kernel-holding layer from the kernel and output shapes that layer actually saw, and of the
    attention products from the projected query and key shapes."""
    import keras

    conformer = _load("conformer_flops_under_test",
                      os.path.join(_REPO_ROOT, "examples", "speech", "conformer.py"))
    encoder = conformer.ConformerEncoder(
        sizes["num_mel_bins"], sizes["d_model"], sizes["num_blocks"], sizes["num_heads"],
        sizes["ff_dim"], sizes["conv_kernel_size"], sizes["subsampling_channels"], 0.0)
    features = np.random.default_rng(0).normal(
        size=(batch, frames_in, sizes["num_mel_bins"])).astype(np.float32)
    lengths = np.full([batch], frames_in, np.int32)
    encoder([features, lengths])  # builds
    counted = []

    def wrap(layer, positions_rank):
        """Positions: the output's leading dimensions (all but the channels; EinsumDense's
        `[B, T, heads, head_dim]` projections: B x T)."""
        call = layer.call

        def counting_call(*args, **kwargs):
            out = call(*args, **kwargs)
            positions = int(np.prod(out.shape[:positions_rank]))
            counted.append((type(layer).__name__, 2 * positions * int(np.prod(layer.kernel.shape))))
            return out
        layer.call = counting_call

    def wrap_attention(layer):
        compute = layer._compute_attention

        def counting_compute(query, key, value, *args, **kwargs):
            b, t, h, k = query.shape
            s = key.shape[1]
            counted.append(("attention products", 2 * 2 * b * h * t * s * k))
            return compute(query, key, value, *args, **kwargs)
        layer._compute_attention = counting_compute

    kinds = {keras.layers.Dense: -1, keras.layers.Conv2D: -1, keras.layers.DepthwiseConv1D: -1,
             keras.layers.EinsumDense: 2}
    for layer in encoder._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.MultiHeadAttention):
            wrap_attention(layer)
        for kind, rank in kinds.items():
            if type(layer) is kind:
                wrap(layer, rank)
    encoder([features, lengths])
    return counted


def test_encoder_flops_against_a_count_of_the_built_model():
    sizes = dict(num_mel_bins=13, d_model=16, num_blocks=2, num_heads=2, ff_dim=24,
                 conv_kernel_size=5, subsampling_channels=6)
    batch, frames_in = 3, 37  # odd sizes: the subsampling's rounding counts
    counted = _brute_force_encoder_flops(sizes, batch, frames_in)
    kinds = {name for name, _ in counted}
    assert {"Conv2D", "Dense", "EinsumDense", "DepthwiseConv1D",
            "attention products"} <= kinds, kinds
    # 2 subsampling convs + projection + per block (4 FF Dense, 4 attention EinsumDense,
    # 2 pointwise Dense, 1 depthwise, the attention products).
    assert len(counted) == 3 + sizes["num_blocks"] * 12
    forward = sum(flops for _, flops in counted)
    got = bench.encoder_flops(batch, frames_in, sizes["num_mel_bins"], sizes["d_model"],
                              sizes["num_blocks"], sizes["num_heads"], sizes["ff_dim"],
                              sizes["conv_kernel_size"], sizes["subsampling_channels"],
                              training=False)
    assert got == forward
    assert bench.encoder_flops(batch, frames_in, sizes["num_mel_bins"], sizes["d_model"],
                               sizes["num_blocks"], sizes["num_heads"], sizes["ff_dim"],
                               sizes["conv_kernel_size"], sizes["subsampling_channels"]) == \
        3 * forward


def test_encoder_flops_of_the_full_model():
    # B=32, 1600 frames: T=400, 16 blocks at d=512. Hand-worked: per block per frame
    # 2*(2*2*512*2048) + 4*2*512^2 + 2*2*400*512 + 2*512*1024 + 2*512*31 + 2*512^2 = 12,909,568;
    # subsampling 2*800*40*512*9 + 2*400*20*512*9*512 per sample, projection 2*400*10240*512.
    per_sample = (16 * 400 * 12_909_568 + 2 * 800 * 40 * 512 * 9 + 2 * 400 * 20 * 512 * 9 * 512
                  + 2 * 400 * 10240 * 512)
    assert bench.encoder_flops(32, 1600, training=False) == 32 * per_sample


def test_tfasr_falls_back_to_the_reference_loss_without_tensorflowasr(monkeypatch):
    import tfasr_baseline
    from keras_baselines import ReferenceRNNTLoss

    monkeypatch.setattr(tfasr_baseline, "available", lambda: (False, "not installed here"))
    loss, description = bench.tfasr_loss_or_fallback()
    assert isinstance(loss, ReferenceRNNTLoss)
    assert "tf_rnnt.reference.rnnt_loss" in description and "not installed here" in description
    row = {"variant": "tfasr", "loss_impl": "full float32 logits + " + description}
    assert "TensorFlowASR not installed" in bench._variant_cell(row)


def test_tfasr_variant_trains_float32_logits_under_mixed_bfloat16(monkeypatch):
    import keras
    import tensorflow as tf
    import tfasr_baseline

    import tf_rnnt

    monkeypatch.setattr(tfasr_baseline, "available", lambda: (False, "not installed here"))
    args = bench.parse_args(["--tiny"])
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        model, loss, description = bench.build(args, "tfasr", 17, reduction=None)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    inputs, labels = bench.synthetic_batch(args, 2, 17)
    logits = model(inputs)
    assert logits.dtype == tf.float32 and logits.shape[-1] == 17
    assert description.startswith("full float32 logits + tf_rnnt.reference.rnnt_loss")
    # The loss reads the frame mask the float32 head keeps.
    lengths = np.asarray(bench._load("c", bench._CONFORMER).output_lengths(
        inputs["feature_lengths"]))
    np.testing.assert_array_equal(np.sum(np.asarray(logits._keras_mask), 1), lengths)
    expected = tf_rnnt.rnnt_loss(logits, np.maximum(labels, 0), lengths,
                                 (labels >= 0).sum(1))
    np.testing.assert_allclose(loss(labels.astype(np.float32), logits).numpy(),
                               expected.numpy(), rtol=1e-4, atol=1e-4)


def _row(**kw):
    row = {"mode": "fit", "variant": "flash", "dtype": "mixed_bfloat16", "gpus_requested": 1,
           "batch": 32, "vocab": 1025, "jit": "false", "status": "ok", "finite": True,
           "replicas": 1, "step_ms": 400.0, "compile_s": 12.5, "peak_gpu_bytes": 20 * 2**30,
           "visible_gpus": 1, "device_name": "NVIDIA H100 80GB HBM3", "tf_version": "2.21.0",
           "encoder_flops": 120e12, "encoder_ms": 300.0, "matmul_flops_per_s": 600e12,
           "loss_impl": "RNNTJoint tiled + FlashRNNTLoss"}
    row.update(kw)
    return row


def _table_rows(text):
    header = next(line for line in text.splitlines() if line.startswith("| GPU"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    return [dict(zip(columns, [c.strip() for c in line.strip("|").split("|")]))
            for line in text.splitlines() if line.startswith("| NVIDIA") or
            line.startswith("| CPU")]


def test_results_merge_and_table(tmp_path):
    args = bench.parse_args([])
    meta = {"model": bench.model_meta(args), "commands": ["--variants flash"]}
    path = str(tmp_path / "model_h100.json")
    first = bench.merge_results(path, meta, [_row(), _row(variant="logits", step_ms=500.0)])
    with open(path, "w") as f:
        json.dump(first, f)
    meta2 = dict(meta, commands=["--variants flash --jit-compile true"])
    merged = bench.merge_results(path, meta2, [
        _row(step_ms=380.0),  # replaces the first flash row
        _row(jit="true", step_ms=250.0, compile_s=210.0, largest_batch=96, bound=""),
        _row(variant="tfasr", status="OOM", step_ms=None, device_name=None, visible_gpus=None,
             gpu_name="NVIDIA H100 80GB HBM3", detail="ResourceExhausted"),
        _row(variant="flash-untiled", jit="true", encoder_ms=None, encoder_alone_ms=200.0)])
    assert merged["meta"]["commands"] == ["--variants flash",
                                          "--variants flash --jit-compile true"]
    text = bench.render(merged)
    rows = _table_rows(text)
    assert [(r["variant"], r["XLA"]) for r in rows] == [
        ("logits", "false"), ("flash", "false"), ("flash", "true"), ("tfasr", "false"),
        ("flash-untiled", "true")]
    assert all(r["GPU"] == "NVIDIA H100 80GB HBM3" for r in rows)
    flash, jit = rows[1], rows[2]
    assert flash["step ms"] == "380.0" and flash["compile s"] == "12.5"
    assert flash["throughput (utt/s)"] == f"{32 / 0.38:.1f}"
    assert flash["encoder share"] == f"{300 / 380:.0%}"
    # 120 TFLOP in 0.3 s = 400 TFLOP/s, 67% of the 600 TFLOP/s matmul.
    assert flash["encoder TFLOP/s"] == "400 (67% of 600)"
    assert flash["peak memory per GPU (MiB)"] == "20,480" and flash["V"] == "1025"
    assert jit["compile s"] == "210.0" and jit["largest batch"] == "96"
    assert rows[3]["step ms"] == "OOM" and rows[3]["encoder share"] == "-"
    # Without a trace: the encoder timed alone, said in the cell (120 TFLOP in 0.2 s).
    assert rows[4]["encoder share"] == "50% (alone)"
    assert rows[4]["encoder TFLOP/s"] == "600 (100% of 600) (alone)"
    assert "flash vs logits: step 380.0 vs 500.0 ms (1.32x the speed)" in text
    assert "- `python benchmarks/bench_model.py --variants flash --jit-compile true`" in text
    with pytest.raises(SystemExit, match="another model"):
        bench.merge_results(path, dict(meta, model=dict(meta["model"], d_model=256)), [])


@pytest.mark.parametrize("jit", ["false", "true"])
def test_encoder_timed_alone(jit):
    import keras
    import tensorflow as tf

    args = bench.parse_args(["--tiny"])
    keras.utils.set_random_seed(0)
    model, _, _ = bench.build(args, "flash", 17)
    inputs, _ = bench.synthetic_batch(args, 2, 17)
    assert 0 < bench.time_encoder_alone(tf, model, inputs, jit, repeats=2) < 60e3


def test_matmul_rate_on_the_cpu():
    import tensorflow as tf

    rate = bench.matmul_rate(tf, 64, dtype="float32", repeats=2)
    assert 1e6 < rate < 1e15


def test_merge_files(tmp_path):
    args = bench.parse_args([])
    model = bench.model_meta(args)
    parts = []
    for k, rows in enumerate([[_row(), _row(variant="logits")], [_row(step_ms=300.0)]]):
        path = tmp_path / f"part{k}.json"
        path.write_text(json.dumps({"meta": {"model": model, "commands": [f"command {k}"]},
                                    "runs": rows}))
        parts.append(str(path))
    out, merged = tmp_path / "model.md", tmp_path / "model.json"
    bench.main(["--merge", *parts, "--json", str(merged), "--out", str(out)])
    data = json.loads(merged.read_text())
    assert data["meta"]["commands"] == ["command 0", "command 1"]
    assert sorted((r["variant"], r["step_ms"]) for r in data["runs"]) == [
        ("flash", 300.0), ("logits", 400.0)]
    assert out.read_text() == bench.render(data)


def test_a_rerun_keeps_the_batch_search_it_replaces():
    meta = {"model": bench.model_meta(bench.parse_args([])), "commands": []}
    searched = _row(step_ms=420.0, largest_batch=96, bound="", first_fail=112, searched=True)
    data = bench.merge_data(None, meta, [searched, _row(variant="logits")])
    data = bench.merge_data(data, meta, [_row(step_ms=380.0), _row(variant="logits",
                                                                    largest_batch=64,
                                                                    bound=">=")])
    runs = {r["variant"]: r for r in data["runs"]}
    assert runs["flash"]["step_ms"] == 380.0 and runs["flash"]["largest_batch"] == 96
    assert runs["flash"]["first_fail"] == 112
    assert runs["logits"]["largest_batch"] == 64 and runs["logits"]["bound"] == ">="
