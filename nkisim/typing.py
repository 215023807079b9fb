"""``nki.typing`` in nkisim: type annotations for kernel parameters (NKI 0.3.0+).

``nt.tensor[128, 512]`` (or ``nt.tensor`` alone) documents a tensor parameter's shape. The real
compiler may use it for specialization; nkisim only needs the names to exist, since shapes are
taken from the arguments at launch. ``nt.scalar`` likewise annotates compile-time numbers.
"""

from __future__ import annotations


class _Annotation:
    def __init__(self, kind: str, args=()):
        self.kind = kind
        self.args = args

    def __getitem__(self, args):
        return _Annotation(self.kind, args if isinstance(args, tuple) else (args,))

    def __repr__(self):
        return f"nt.{self.kind}[{', '.join(map(str, self.args))}]" if self.args else f"nt.{self.kind}"


tensor = _Annotation("tensor")
scalar = _Annotation("scalar")
