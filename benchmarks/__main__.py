"""``python -m benchmarks [SCHEMES...] [options]`` (see benchmarks/cli.py)."""

from benchmarks.cli import bench

if __name__ == "__main__":
    bench(prog_name="python -m benchmarks")
