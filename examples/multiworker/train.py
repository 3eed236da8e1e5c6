"""Training a tf_rnnt transducer across processes and hosts: a custom loop for
`tf.distribute.MultiWorkerMirroredStrategy`.

Keras 3's `model.fit` does not run under `MultiWorkerMirroredStrategy` (keras-team/keras#20585),
so training across hosts uses the custom loop TensorFlow documents for it: `strategy.run` of a
step that computes per-example costs (`FlashRNNTLoss(reduction=None)`), averages them over the
**global** batch (`tf.nn.compute_average_loss`) and lets the optimizer all-reduce (sum) the
gradients. The loop also runs under `MirroredStrategy` and the default strategy.

Each worker process reads its place in the cluster from `TF_CONFIG`, e.g. on host 0 of two:

    TF_CONFIG='{"cluster": {"worker": ["host0:12345", "host1:12345"]},
                "task": {"type": "worker", "index": 0}}'

and the same cluster with `"index": 1` on host 1. Every worker runs the same program.

Run two workers on this machine (CPU, a small transducer, synthetic data):

    python examples/multiworker/train.py --local-workers 2 --steps 5

Library use: `DistributedTrainer(strategy, model, optimizer, global_batch_size).fit(
dataset_fn, steps)`, `launch_local_workers(...)` to start N workers with `TF_CONFIG` on
localhost.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))


# ----------------------------------------------------------------------------------------------
# Cluster set-up (no TensorFlow import: the launcher stays light).
# ----------------------------------------------------------------------------------------------
def free_ports(count):
    """`count` distinct TCP ports that were free on localhost a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("localhost", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(addresses, index):
    """The `TF_CONFIG` JSON of worker `index` in a cluster of `addresses` ("host:port")."""
    return json.dumps({"cluster": {"worker": list(addresses)},
                       "task": {"type": "worker", "index": index}})


_PORT_ERRORS = ("Address already in use", "address already in use", "Failed to add port")


def launch_local_workers(command, num_workers, gpus=None, env=None, timeout=600, attempts=3):
    """Runs `num_workers` worker processes on localhost, each with its `TF_CONFIG`.

    Args:
      command: `command(index)` -> argv of worker `index`.
      num_workers: N.
      gpus: None: every worker sees no GPU (`CUDA_VISIBLE_DEVICES=""`); a list of N GPU ids:
        worker i sees `gpus[i]` only.
      env: base environment (default `os.environ`).
      timeout: seconds for the whole group; on expiry every worker is killed.
      attempts: tries with fresh ports when a worker could not bind its port.

    Returns:
      list of `(returncode, stdout, stderr)` per worker; returncode None after a timeout.
    """
    base = dict(os.environ if env is None else env)
    base.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for attempt in range(attempts):
        ports = free_ports(num_workers)
        addresses = [f"localhost:{p}" for p in ports]
        procs, logs = [], []
        try:
            for i in range(num_workers):
                worker_env = dict(base, TF_CONFIG=tf_config(addresses, i),
                                  CUDA_VISIBLE_DEVICES="" if gpus is None else str(gpus[i]))
                out = tempfile.TemporaryFile(mode="w+")
                err = tempfile.TemporaryFile(mode="w+")
                logs.append((out, err))
                procs.append(subprocess.Popen(command(i), env=worker_env, stdout=out, stderr=err,
                                              start_new_session=True))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes):
                    break
                if any(c not in (None, 0) for c in codes):  # one failed: the rest would hang
                    time.sleep(2.0)
                    break
                time.sleep(0.2)
        finally:
            killed = set()
            for i, p in enumerate(procs):
                if p.poll() is None:
                    _kill_group(p)
                    killed.add(i)
        results = []
        for i, (p, (out, err)) in enumerate(zip(procs, logs)):
            out.seek(0)
            err.seek(0)
            results.append((None if i in killed else p.returncode, out.read(), err.read()))
            out.close()
            err.close()
        port_clash = any(any(e in r[2] for e in _PORT_ERRORS) for r in results)
        if all(r[0] == 0 for r in results) or not port_clash or attempt == attempts - 1:
            return results
    return results


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ----------------------------------------------------------------------------------------------
# The training loop.
# ----------------------------------------------------------------------------------------------
def make_strategy(kind="auto", communication="auto"):
    """A `tf.distribute` strategy.

    Args:
      kind: "multiworker" (`MultiWorkerMirroredStrategy`, cluster from `TF_CONFIG`),
        "mirrored" (`MirroredStrategy` over the visible GPUs), "default" (no distribution),
        or "auto": multiworker when `TF_CONFIG` is set, else default.
      communication: "auto", "nccl" or "ring": the multi-worker collectives' implementation
        (NCCL needs GPUs).
    """
    import tensorflow as tf

    if kind == "auto":
        kind = "multiworker" if os.environ.get("TF_CONFIG") else "default"
    if kind == "multiworker":
        implementation = {
            "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
            "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        }[communication]
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy()
    if kind == "default":
        return tf.distribute.get_strategy()
    raise ValueError(f"unknown strategy kind {kind!r}")


class DistributedTrainer:
    """The custom training loop: per-example costs, averaged over the global batch.

    Build the model and optimizer under `strategy.scope()`. `fit` calls `dataset_fn` once per
    input pipeline (`tf.distribute.InputContext`); it must return that pipeline's share of the
    data, batched to `input_context.get_per_replica_batch_size(global_batch_size)`, with
    elements `(inputs, labels)` (or `(inputs, labels, sample_weight)`).

    Args:
      strategy: a `tf.distribute.Strategy`.
      model: a Keras model whose output `loss` accepts.
      optimizer: a Keras optimizer (it all-reduces the gradients in replica context).
      global_batch_size: samples per step over all replicas.
      loss: a Keras loss with `reduction=None` giving `[B]` per-example costs; default
        `tf_rnnt.keras.FlashRNNTLoss(reduction=None)`.
    """

    def __init__(self, strategy, model, optimizer, global_batch_size, loss=None):
        import tensorflow as tf

        from tf_rnnt.keras import FlashRNNTLoss

        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.global_batch_size = int(global_batch_size)
        self.loss = FlashRNNTLoss(reduction=None) if loss is None else loss
        self._step = tf.function(self._distributed_step)

    def _replica_step(self, element):
        import tensorflow as tf

        inputs, labels = element[0], element[1]
        sample_weight = element[2] if len(element) > 2 else None
        with tf.GradientTape() as tape:
            outputs = self.model(inputs, training=True)
            costs = self.loss(labels, outputs, sample_weight=sample_weight)  # [B] per example
            loss = tf.nn.compute_average_loss(costs, global_batch_size=self.global_batch_size)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
            scaled = self.optimizer.scale_loss(loss) if hasattr(self.optimizer, "scale_loss") \
                else loss
        variables = self.model.trainable_variables
        grads = tape.gradient(scaled, variables)
        self.optimizer.apply_gradients(zip(grads, variables))
        return loss

    def _distributed_step(self, iterator):
        import tensorflow as tf

        per_replica = self.strategy.run(self._replica_step, args=(next(iterator),))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def distribute(self, dataset_fn):
        """An iterator over the distributed dataset of `dataset_fn`."""
        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

    def fit(self, dataset_fn, steps, on_step=None):
        """Runs `steps` steps; returns the global mean loss of each (float, host-synced).

        Args:
          dataset_fn: see the class docstring.
          steps: number of steps.
          on_step: optional `on_step(step, loss, seconds)` after each step; `seconds` is the
            step's wall time including the host sync of its loss.
        """
        iterator = self.distribute(dataset_fn)
        losses = []
        for step in range(steps):
            start = time.perf_counter()
            loss = float(self._step(iterator))
            seconds = time.perf_counter() - start
            losses.append(loss)
            if on_step is not None:
                on_step(step, loss, seconds)
        return losses


# ----------------------------------------------------------------------------------------------
# A small transducer and synthetic data (the test, the demo).
# ----------------------------------------------------------------------------------------------
def build_small_transducer(num_features=8, encoder_dim=16, predictor_dim=16, joint_dim=12,
                           vocab_size=7, seed=0):
    """Masking + Dense encoder, Embedding + LSTM predictor, `RNNTJoint`: inputs
    `[features [B, T, F] zero-padded, labels [B, U] padded with -1]` -> lattice."""
    import keras
    import tensorflow as tf

    from tf_rnnt.keras import RNNTJoint

    keras.utils.set_random_seed(seed)
    features = keras.Input((None, num_features), name="features")
    labels = keras.Input((None,), dtype="int32", name="labels")
    encoder = keras.layers.Masking(mask_value=0.0)(features)
    encoder = keras.layers.Dense(encoder_dim, activation="tanh")(encoder)

    class BlankPrefixed(keras.layers.Layer):
        def call(self, labels):
            labels = tf.where(labels < 0, 0, labels)
            return tf.pad(labels, [[0, 0], [1, 0]], constant_values=0)

        def compute_output_shape(self, shape):
            return (shape[0], None if shape[1] is None else shape[1] + 1)

    predictor = keras.layers.Embedding(vocab_size, predictor_dim)(BlankPrefixed()(labels))
    predictor = keras.layers.LSTM(predictor_dim, return_sequences=True, use_cudnn=False)(predictor)
    lattice = RNNTJoint(vocab_size, joint_dim, name="joint")([encoder, predictor, labels])
    return keras.Model([features, labels], lattice)


def synthetic_examples(num, frames=12, num_labels=5, num_features=8, vocab_size=7, seed=0):
    """`(features [num, T, F], labels [num, U])` numpy arrays with ragged lengths."""
    import numpy as np

    rng = np.random.default_rng(seed)
    frame_lengths = rng.integers(frames // 2, frames + 1, size=num)
    label_lengths = rng.integers(1, num_labels + 1, size=num)
    features = rng.normal(size=(num, frames, num_features)).astype(np.float32)
    features[np.arange(frames)[None, :] >= frame_lengths[:, None]] = 0.0
    labels = rng.integers(1, vocab_size, size=(num, num_labels)).astype(np.int32)
    labels[np.arange(num_labels)[None, :] >= label_lengths[:, None]] = -1
    return features, labels


def sharded_dataset_fn(features, labels, global_batch_size):
    """`dataset_fn` giving input pipeline i of n the examples i, i + n, i + 2n, ...: step k's
    global batch is examples `[k * G, (k + 1) * G)` for any number of pipelines."""
    import tensorflow as tf

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch_size)
        dataset = tf.data.Dataset.from_tensor_slices(((features, labels), labels))
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
        return dataset.batch(batch, drop_remainder=True).repeat()

    return dataset_fn


def run_small(args):
    """Trains the small transducer for `args.steps` steps under the strategy `TF_CONFIG` (or
    its absence) gives; worker 0 writes the losses, initial and final weights to `args.out`
    (JSON)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    strategy = make_strategy(args.strategy, args.communication)
    import keras

    tf.config.experimental.enable_tensor_float_32_execution(False)
    features, labels = synthetic_examples(args.global_batch * args.steps, seed=args.seed)
    with strategy.scope():
        model = build_small_transducer(seed=args.seed)
        optimizer = keras.optimizers.Adam(args.learning_rate)
    initial = [w.numpy().tolist() for w in model.weights]
    trainer = DistributedTrainer(strategy, model, optimizer, args.global_batch)
    losses = trainer.fit(sharded_dataset_fn(features, labels, args.global_batch), args.steps)
    result = {"num_replicas": strategy.num_replicas_in_sync, "losses": losses,
              "initial_weights": initial,
              "weights": [w.numpy().tolist() for w in model.weights],
              "paths": [w.path for w in model.weights]}
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if args.out and task.get("index", 0) == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    print("LOSSES " + json.dumps(losses), flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="auto",
                        choices=("auto", "multiworker", "mirrored", "default"))
    parser.add_argument("--communication", default="auto", choices=("auto", "nccl", "ring"))
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON with losses and final weights")
    parser.add_argument("--local-workers", type=int, default=0,
                        help="start this many CPU workers on localhost and wait for them")
    parser.add_argument("--timeout", type=int, default=300)
    return parser.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.local_workers:
        worker_argv = []
        skip = False
        for a in argv:  # the workers get the same flags minus --local-workers
            if skip:
                skip = False
                continue
            if a == "--local-workers":
                skip = True
                continue
            if a.startswith("--local-workers="):
                continue
            worker_argv.append(a)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [_REPO, os.environ.get("PYTHONPATH", "")]))
        results = launch_local_workers(
            lambda i: [sys.executable, os.path.abspath(__file__)] + worker_argv,
            args.local_workers, env=env, timeout=args.timeout)
        for i, (code, out, err) in enumerate(results):
            print(f"worker {i}: exit {code}")
            print(out.strip() or err.strip()[-2000:])
        sys.exit(0 if all(r[0] == 0 for r in results) else 1)
    run_small(args)


if __name__ == "__main__":
    if _REPO not in sys.path and os.path.isdir(os.path.join(_REPO, "tf_rnnt")):
        sys.path.insert(0, _REPO)
    main()
