"""``python -m benchmarks [SCHEMES...] [options]``: the same command as ``pedsl bench``."""

from pedsl.cli.bench import bench

if __name__ == "__main__":
    bench(prog_name="python -m benchmarks")
