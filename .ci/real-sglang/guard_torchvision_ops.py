"""Let PyPI's torchvision import beside a CPU-only torch build, for SGLang's imports on the CI machine.

PyPI's torchvision wheel links its operator library (`torchvision/_C.so`) against the CUDA build of torch; beside
the CPU build it does not load, which torchvision tolerates everywhere except two fake-tensor registrations
(`torchvision::nms`, `torchvision::qnms` in `_meta_registrations.py`) that it makes without checking, so
`import torchvision` fails with `operator torchvision::nms does not exist`. SGLang imports torchvision only for
its vision-model configs and never calls its operators when serving a text model. This rewrites those two
registrations to be made only when the operator library loaded, as every other registration in that file is.
Idempotent. Usage: python guard_torchvision_ops.py  (with the virtualenv's interpreter)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

GUARD = '''def _register_fake_if_ops(qualname):
    """ddsweep CI: register a fake implementation only when torchvision's operator library loaded."""

    def wrapper(fn):
        if torchvision.extension._has_ops():
            torch.library.register_fake(qualname)(fn)
        return fn

    return wrapper


'''


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("guard_torchvision_ops: torchvision is not installed", file=sys.stderr)
        return 2
    path = Path(spec.origin).parent / "_meta_registrations.py"
    text = path.read_text()
    if "_register_fake_if_ops" in text:
        return 0
    for op in ("nms", "qnms"):
        decorator = f'@torch.library.register_fake("torchvision::{op}")'
        if decorator not in text:
            print(f"guard_torchvision_ops: {path} has no line {decorator}; this torchvision is not the one the "
                  "guard was written for", file=sys.stderr)
            return 1
        text = text.replace(decorator, f'@_register_fake_if_ops("torchvision::{op}")')
    anchor = "def register_meta("
    text = text.replace(anchor, GUARD + anchor, 1)
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
