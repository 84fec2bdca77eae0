"""Property 1, accepted by Energon: cook functions are ``@stateless``; the TaskEncoder builds on the data
and yields a batch; every cooker matches some dataset the target is meant for."""

from __future__ import annotations

from megatron.energon.task_encoder.base import get_stateless

from ..context import CheckContext
from ..execution import build_loader, closing, matching_cooker
from ._common import fail


def check(ctx: CheckContext) -> dict:
    cookers = ctx.target.cookers
    if not cookers:
        fail(
            f"{ctx.target.describe()} registers no cookers; Energon cannot load a CrudeWebdataset without one"
        )
    for index, cooker in enumerate(cookers):
        if not get_stateless(cooker.cook):
            name = getattr(cooker.cook, "__qualname__", repr(cooker.cook))
            fail(
                f"cooker {index} ({name}) is not marked @stateless: Energon fails every sample with "
                "'Cooker must be stateless' and stops after 100 in a row. Decorate the cook function with "
                "@megatron.energon.stateless (@cooker alone does not do it)",
                ctx.reproduce("accepted"),
            )
    checked = {}
    for encoding in ctx.encodings():
        path = ctx.main_dataset(encoding)
        subflavors = ctx.workspace.subflavors(path)
        if matching_cooker(cookers, subflavors) is None:
            fail(
                f"no cooker matches the dataset {str(path)!r} (subflavors {subflavors}); the cookers ask for "
                f"{[c.has_subflavors for c in cookers]}. Energon raises 'No cooker found' when the loader is built",
                ctx.reproduce("accepted"),
            )
        try:
            with closing(build_loader(ctx.target, path, batch_size=2, num_workers=0, mode="val")) as loader:
                next(iter(loader))
        except Exception as error:
            fail(
                f"loading the clean dataset {str(path)!r} (subflavors {subflavors}) failed: "
                f"{type(error).__name__}: {error}",
                ctx.reproduce("accepted"),
            )
        checked[str(encoding)] = subflavors
    return {"datasets": checked}
