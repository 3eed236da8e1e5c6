"""tf_rnnt.keras under tf.distribute.MirroredStrategy: 2 replicas equal 1 device.

Logical devices must be configured before TensorFlow initializes, which the other test modules
already did in the pytest process; so the runs happen in a fresh subprocess (this file run as a
script) that splits the CPU into two logical devices (or uses two GPUs, or splits one GPU), fits
one step of the same model on the same global batch on one device and on 2 replicas, and
writes the losses and gradients (recorded by an optimizer that changes nothing) to a JSON file.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

# The worker (this file run as a script) imports test_keras, which imports oracle and
# rnnt_testing (tests/) and keras_baselines (benchmarks/).
_HERE = os.path.dirname(os.path.abspath(__file__))
_TESTS_DIR = os.path.dirname(_HERE)
_REPO_ROOT = os.path.dirname(_TESTS_DIR)
_WORKER_PATH = [_HERE, _TESTS_DIR, _REPO_ROOT, os.path.join(_REPO_ROOT, "benchmarks")]


def _run_worker(kind, tmp_path):
    out = os.path.join(tmp_path, f"distributed_{kind}.json")
    path = os.pathsep.join([*_WORKER_PATH, os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), kind, out], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    with open(out) as f:
        return json.load(f)


def _check(results):
    assert results["num_replicas"] == 2
    assert len(results["cases"]) == 4
    for case in results["cases"]:
        # Replicas with different label counts: a per-replica normalisation would differ.
        assert len(set(case["replica_label_counts"])) == 2, case["replica_label_counts"]
        name = case["name"]
        single, mirrored = case["single"], case["mirrored"]
        np.testing.assert_allclose(mirrored["loss"], single["loss"], rtol=1e-5, err_msg=name)
        assert len(single["gradients"]) == len(mirrored["gradients"]) > 0
        for path, expected, got in zip(case["paths"], single["gradients"],
                                       mirrored["gradients"]):
            expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
            assert np.any(expected != 0), f"{name} {path}"
            scale = np.linalg.norm(expected)
            assert np.linalg.norm(got - expected) <= 1e-5 * scale, f"{name} {path}"
            np.testing.assert_allclose(got, expected, rtol=1e-5,
                                       atol=1e-5 * np.max(np.abs(expected)),
                                       err_msg=f"{name} {path}")


@pytest.mark.slow
def test_mirrored_two_cpu_replicas_equal_single_device(tmp_path):
    _check(_run_worker("cpu", tmp_path))


@pytest.mark.slow
@pytest.mark.gpu
def test_mirrored_two_gpu_replicas_equal_single_device(tmp_path):
    _check(_run_worker("gpu", tmp_path))


# ----------------------------------------------------------------------------------------------
# The worker (a fresh process).
# ----------------------------------------------------------------------------------------------
def _devices(kind):
    import tensorflow as tf

    if kind == "cpu":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
        return ["/cpu:0", "/cpu:1"], tf.distribute.ReductionToOneDevice("/cpu:0")
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= 2:
        return ["/gpu:0", "/gpu:1"], None  # real replicas: the default (NCCL) all-reduce
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=4096)] * 2)
    return ["/gpu:0", "/gpu:1"], tf.distribute.ReductionToOneDevice("/gpu:0")


def _fit_one_step(model, dataset, reduction):
    import test_keras as tk

    recorder = tk.GradientRecorder()
    model.compile(optimizer=recorder, loss=model.get_layer("joint").loss(reduction=reduction))
    history = model.fit(dataset, epochs=1, verbose=0)
    return {"loss": history.history["loss"][0],
            "gradients": [g.numpy().tolist() for g in recorder.gradients]}


def _worker(kind, out):
    devices, cross_device_ops = _devices(kind)
    import tensorflow as tf
    import test_keras as tk

    tf.config.experimental.enable_tensor_float_32_execution(False)  # exact GEMMs on GPUs

    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
    examples = tk.make_examples(4, seed=22)
    results = {"num_replicas": strategy.num_replicas_in_sync, "cases": []}
    sample_weights = np.array([0.5, 2.0, 1.0, 0.25], np.float32)
    # The global batch of 4 splits into samples [0, 1] and [2, 3], one pair per replica.
    label_counts = [sum(len(labels) for _, labels in examples[:2]),
                    sum(len(labels) for _, labels in examples[2:])]
    for name, weights, reduction in [
            ("unweighted", None, "sum_over_batch_size"),
            ("weighted", sample_weights, "sum_over_batch_size"),
            ("per_token-unweighted", None, "per_token"),
            ("per_token-weighted", sample_weights, "per_token")]:
        dataset = tk.make_dataset(examples, batch_size=4, weights=weights)  # one global batch
        with tf.device(devices[0]):
            single_model, _ = tk.build_transducer(seed=5)
            single = _fit_one_step(single_model, dataset, reduction)
        with strategy.scope():
            mirrored_model, _ = tk.build_transducer(seed=6)
            mirrored_model.set_weights(single_model.get_weights())
            mirrored = _fit_one_step(mirrored_model, dataset, reduction)
        results["cases"].append({"name": name, "single": single, "mirrored": mirrored,
                                 "replica_label_counts": label_counts,
                                 "paths": [v.path for v in single_model.trainable_variables]})
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
