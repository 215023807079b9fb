"""Read ``build.toml`` (kernel-builder edition 5) into what the build and the upload need.

The file is validated with the parser that ships in ``kernels`` (``kernels._rust.Build``), so a key that
kernel-builder would reject fails here too; the values are then read with ``tomllib``.
Limits: only the noarch (``[torch-noarch]``) layout is supported, and ``backends`` must be ``["neuron"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip (present in every venv) vendors the same parser
    from pip._vendor import tomli as tomllib

BUILD_TOML = "build.toml"
SUPPORTED_BACKENDS = ["neuron"]


class BuildConfigError(ValueError):
    """build.toml is missing, malformed or describes something this build cannot produce."""


@dataclass(frozen=True)
class KernelConfig:
    name: str                      # Hub kernel name, dashes: "neuron-vit-attn"
    version: int                   # major version; the Hub branch is f"v{version}"
    license: str
    repo_id: str                   # default upload target ([general.hub] repo-id)
    neuron_python_depends: list[str] = field(default_factory=list)

    @property
    def module_name(self) -> str:
        """Python module name of the package (kernel-builder: dashes become underscores)."""
        return self.name.replace("-", "_")


def load_config(repo_root: Path) -> KernelConfig:
    """Parse and validate ``repo_root/build.toml``."""
    path = repo_root / BUILD_TOML
    if not path.is_file():
        raise BuildConfigError(f"{path.name} not found in the repository root; `make build` runs from a clone of "
                               "the repo")
    try:
        from kernels._rust import Build
        Build.open(repo_root)
    except ValueError as exc:
        raise BuildConfigError(f"{path.name} is not valid kernel-builder configuration: {exc}") from exc
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    general = data.get("general", {})
    if "torch-noarch" not in data:
        raise BuildConfigError(f"{path.name} needs a [torch-noarch] table: NKI kernels are pure Python")
    backends = general.get("backends")
    if backends != SUPPORTED_BACKENDS:
        raise BuildConfigError(f"{path.name}: [general] backends = {backends!r}, this build supports "
                               f"{SUPPORTED_BACKENDS!r}")
    missing = [key for key in ("name", "version", "license") if key not in general]
    if missing:
        raise BuildConfigError(f"{path.name}: [general] lacks {', '.join(missing)}")
    version = general["version"]
    if not isinstance(version, int) or version < 1:
        raise BuildConfigError(f"{path.name}: [general] version must be a positive integer, got {version!r}")
    repo_id = general.get("hub", {}).get("repo-id")
    if not repo_id:
        raise BuildConfigError(f"{path.name}: [general.hub] repo-id is required (the default upload target)")
    return KernelConfig(name=general["name"], version=version, license=general["license"], repo_id=repo_id,
                        neuron_python_depends=list(general.get("neuron", {}).get("python-depends", [])))
