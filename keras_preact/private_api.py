"""Every private API of another library (Keras, TensorFlow, KerasTuner) keras-preact uses,
each in one function and nowhere else (a test checks it): when one moves, this is the file
to fix. Checked on Keras 3.15.1, TensorFlow 2.21 and KerasTuner 1.4.8."""


def flatten_layers(model):
    """Every layer inside `model`, nested ones too (`model.layers` has only the top level)."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def is_functional(model):
    """Whether `model` is a functional Keras model (it has `_operations`)."""
    return hasattr(model, "_operations")


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN kernels (fixed at import; it has no public query)."""
    from tensorflow.python.util import _pywrap_util_port
    return bool(_pywrap_util_port.IsMklEnabled())


def configure_coordination_service(*, leader, job_counts, register_timeout_ms,
                                   heartbeat_timeout_ms):
    """Configures TensorFlow's coordination service with timeouts, before a multi-worker
    strategy configures it without them (a chief would wait for a missing worker forever).
    `leader` is a task ("/job:worker/replica:0/task:0"), `job_counts` maps job name -> tasks.
    Returns True when configured, False if it already was, None without an importable config."""
    from tensorflow.python.eager import context
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    except ImportError:  # the module moves between TensorFlow releases
        return None
    if context.context().coordination_service is not None:
        return False
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=leader,
        cluster_register_timeout_in_ms=register_timeout_ms,
        heartbeat_timeout_in_ms=heartbeat_timeout_ms,
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name=job, num_tasks=count)
                          for job, count in job_counts.items()])
    return True


def write_weights_h5(model, fileobj):
    """Writes `model`'s weights into `fileobj` (an `io.BytesIO`) as `model.save_weights` would
    (it takes only a path, and HDF5 writing to a full disk crashes the process at exit)."""
    from keras.src.saving import saving_lib
    store = saving_lib.H5IOStore(fileobj, mode="w")
    saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                           visited_saveables=set())
    store.close()


def optimizer_variable_index(optimizer, variable):
    """The index of `variable` in the list `optimizer` was built with, as Keras' own update
    steps find their slots; also for the per-replica copy a distribution strategy passes to
    `update_step`, which a map of the built variables would miss."""
    return optimizer._get_variable_index(variable)


def add_oracle_servicer(server, oracle):
    """Adds KerasTuner's chief oracle service for `oracle` to the gRPC `server`, as its chief
    `search()` does; returns ``done()``: whether a worker was told the search is over and
    no trial or worker is left, when the chief may stop serving."""
    from keras_tuner.src import protos
    from keras_tuner.src.distribute import oracle_chief
    servicer = oracle_chief.OracleServicer(oracle)
    protos.get_service_grpc().add_OracleServicer_to_server(servicer, server)
    return lambda: servicer.stop_triggered and oracle_chief.exit_chief(oracle)
