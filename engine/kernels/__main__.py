"""`python -m engine.kernels`: every GPU kernel compiled into CuPy's cache now (make setup runs it on a
machine with an NVIDIA GPU, so that the first start finds them built: engine/kernels/build.py)."""
import sys

from engine.kernels import build, built_kernels, sm90


def main() -> int:
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # no CuPy or no GPU: nothing to build, the engine runs on NumPy
        build.log(f"no GPU kernels to build ({type(e).__name__}: {e})")
        return 0
    build.prebuild(cp, build.units(built_kernels()) + ([build.SM90] if sm90.supported(cp) else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
