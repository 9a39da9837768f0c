"""Run-time evaluation of `.pe` expressions: one walk (:mod:`pedsl.runtime.walk`) over labelled
arrays, with two array backends - torch (:mod:`pedsl.runtime.torch_backend`, the compiled module's
trainable values) and numpy (:mod:`pedsl.runtime.numpy_backend`, ``pedsl diff --numeric``, which
never imports torch)."""
