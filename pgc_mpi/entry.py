"""The `pgc-train` console entry, kept light: stop signals are handled before torch is imported,
so a signal that arrives while the ranks are still starting does not kill one of them."""

from __future__ import annotations


def train() -> None:
    """Run pgc-train (does not return: it finalizes MPI and exits)."""
    import faulthandler

    from . import signals

    faulthandler.enable()  # a crash in native code (torch, MPI) still says where it happened
    signals.install()
    from .train import cli

    cli()
