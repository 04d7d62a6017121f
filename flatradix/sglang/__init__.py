"""flatradix as a TreeCore of SGLang 0.5.23's ``UnifiedRadixCache`` (plug-in ``flatradix``).

SGLang's cache controller delegates every tree decision to a *TreeCore* chosen
from a registry (``sglang.srt.mem_cache.unified_cache.tree_core_registry``).
This subpackage registers flatradix's engine there under the name
``flatradix``, through SGLang's plug-in entry point group
``sglang.srt.plugins`` (``setup.cfg``; installed with the ``sglang`` extra), so

    pip install "flatradix[sglang]"
    SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=flatradix python -m sglang.launch_server ...

runs SGLang's scheduler on flatradix's kernels with no change to SGLang. A plain
``import flatradix`` never imports this subpackage, nor SGLang.

What is served and what is refused at construction: ``docs/sglang_plugin.md``.
"""

#: The name the TreeCore is registered under (``tree_core_backend`` /
#: ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``).
BACKEND_NAME = "flatradix"


def _factory(params, components):
    """SGLang's ``TreeCoreFactory``: ``(CacheInitParams, {ComponentType: TreeComponent})``
    -> the TreeCore. Refuses (``ValueError`` naming the option) any configuration it
    does not serve, before anything is built. The inspection variant SGLang's test
    kits need when the kits are installed (they ship in SGLang's wheel), else the
    plain one."""
    try:
        from .inspector import FlatradixTreeCoreInspector as tree_core
    except ImportError:  # pragma: no cover - SGLang without its test kits
        from .core import FlatradixTreeCore as tree_core
    return tree_core(params, components)


def register():
    """Register the ``flatradix`` TreeCore with SGLang (the ``sglang.srt.plugins``
    entry point). Idempotent: SGLang loads plug-ins in every process it starts,
    and a second registration under one name is an error there."""
    from sglang.srt.mem_cache.unified_cache.tree_core_registry import (
        get_tree_core_factory,
        register_tree_core_backend,
    )

    if get_tree_core_factory(BACKEND_NAME) is None:
        register_tree_core_backend(BACKEND_NAME, _factory)
