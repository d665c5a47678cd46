"""Model lifecycle over HTTP: list versions and deployments (read), install a bundle and
change deployments (admin). Every change is a ``model_deployments`` row and an audit
record (who: the key, what, why: ``reason``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from io import BufferedWriter
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from radserve.api.auth import Principal, require_admin, require_read, shown_actor
from radserve.api.negotiation import NegotiatedRoute
from radserve.api.schemas import ErrorOut
from radserve.api.state import service_of as _service
from radserve.domain.deployment import Role, StepDeployment
from radserve.errors import BundleRejectedError, InvalidRequestError, quoted
from radserve.lifecycle.deploy_options import check_deploy_options
from radserve.lifecycle.install import is_zip, upload_path
from radserve.lifecycle.install_tasks import InstallTask
from radserve.service.errors import InstallNotFoundError
from radserve.service.variant_install import VariantRequest, install_summary

router = APIRouter(tags=["models"], route_class=NegotiatedRoute)
_ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": ErrorOut} for c in (400, 401, 403, 404, 409, 413, 422)
}
_MAX_BUNDLE_BYTES = 8 * 1024**3


class DeploymentOut(BaseModel):
    id: int | None
    created: str | None
    step: str
    stable: str
    canary: str | None
    canary_percent: float
    canary_urgent: bool
    shadow: str | None
    shadow_percent: float
    action: str
    actor: str | None
    reason: str | None

    @classmethod
    def of(cls, d: StepDeployment, actor: str | None = None) -> DeploymentOut:
        """``actor``: who made the change as the caller may see it (:func:`shown_actor`)."""
        return cls(
            id=d.id,
            created=d.created.isoformat() if d.created else None,
            step=d.step,
            stable=d.stable,
            canary=d.canary,
            canary_percent=d.canary_percent,
            canary_urgent=d.canary_urgent,
            shadow=d.shadow,
            shadow_percent=d.shadow_percent,
            action=d.action.value,
            actor=actor,
            reason=d.reason,
        )


class ModelsOut(BaseModel):
    versions: list[dict[str, Any]] = Field(description="every installed version")
    deployments: list[DeploymentOut] = Field(description="what serves each step now")


class DeployIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(min_length=1, max_length=64)
    role: Literal["stable", "canary", "shadow"] = "stable"
    percent: float = Field(0.0, ge=0, le=100, description="canary/shadow share of studies")
    include_urgent: bool = Field(False, description="canary: route URGENT studies too")
    reason: str = Field(min_length=1, max_length=1000, description="why (audited)")


class ChangeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000, description="why (audited)")


class UndeployIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # only the shadow: a canary is dropped by rollback, the stable version is replaced
    role: Literal["shadow"] = Field(description="the role to remove")
    reason: str | None = Field(None, min_length=1, max_length=1000, description="why (audited)")


@router.get("/v1/models", response_model=ModelsOut, responses=_ERRORS, summary="Model versions")
async def list_models(
    request: Request, who: Annotated[Principal, Depends(require_read)]
) -> ModelsOut:
    lifecycle = _service(request).lifecycle

    def read() -> ModelsOut:
        return ModelsOut(
            versions=lifecycle.status(),
            deployments=[
                DeploymentOut.of(d, shown_actor(request, who, d.actor))
                for d in lifecycle.active().values()
            ],
        )

    return await run_in_threadpool(read)


class InstallOut(BaseModel):
    name: str
    version: str
    files: dict[str, str] = Field(description="SHA-256 of every installed file")
    variants: dict[str, Any] = Field(
        description="per variant built: accepted, and the gate's reasons if not"
    )
    shipped_gate: Literal["set_aside", "trusted"] | None = Field(
        None,
        description="a gate.json that came in the bundle: set_aside (kept as "
        "gate.shipped.json, not trusted: its reduced-precision variants do not serve "
        "until gated on this site, with build_variants=true), trusted (trust_gate=true: "
        "served on it); null: the bundle had none",
    )


class InstallTaskOut(BaseModel):
    id: str
    state: Literal["queued", "building", "installed", "rejected", "failed", "interrupted"]
    created: str
    source: str
    actor: str | None
    precisions: list[str] | None = Field(description="variants asked for (None: the default)")
    started: str | None
    finished: str | None
    result: InstallOut | None = Field(description="once installed")
    error: dict[str, str] | None = Field(description="code and message, once it ended otherwise")
    attempts: int = Field(
        0,
        description="builds started: more than 1 when a stop or a crash cut one short and "
        "the next server built it again",
    )

    @classmethod
    def of(cls, task: InstallTask) -> InstallTaskOut:
        return cls.model_validate(task.as_json())


_WRITE_BYTES = 1 << 20  # the body is written in batches of about this much, off the loop


async def _received_zip(request: Request, data_dir: Path) -> tuple[Path, str]:
    """The request body, written to an upload file of this process, checked to be a zip,
    and how the install records its source. The file is written in a worker thread (not
    on the event loop), and removed whatever ends the request before it is returned (a
    client that goes away mid-upload, a refusal): before 2026-12-07 an aborted upload's
    part file stayed until the next server start."""
    path = await run_in_threadpool(upload_path, data_dir)
    out = await run_in_threadpool(open, path, "xb")
    size = 0
    try:
        pending: list[bytes] = []
        pending_bytes = 0
        async with aclosing(request.stream()) as stream:
            async for chunk in stream:
                size += len(chunk)
                if size > _MAX_BUNDLE_BYTES:
                    raise InvalidRequestError("the bundle is larger than 8 GiB")
                pending.append(chunk)
                pending_bytes += len(chunk)
                if pending_bytes >= _WRITE_BYTES:
                    await run_in_threadpool(out.writelines, pending)
                    pending, pending_bytes = [], 0
        await run_in_threadpool(_finish, out, pending)
        if size == 0:
            raise InvalidRequestError("send the bundle as a zip in the request body")
        if not await run_in_threadpool(is_zip, path):
            raise BundleRejectedError(
                f"the request body ({size} bytes) is not a zip archive; send the bundle "
                "folder (model.yaml and its ONNX files) zipped"
            )
    except BaseException:
        with anyio.CancelScope(shield=True):  # a cancelled request still removes it
            await run_in_threadpool(_discard, out, path)
        raise
    return path, f"HTTP upload ({size} bytes)"


def _finish(out: BufferedWriter, pending: list[bytes]) -> None:
    out.writelines(pending)
    out.close()


def _discard(out: BufferedWriter, path: Path) -> None:
    out.close()
    path.unlink(missing_ok=True)


@router.post(
    "/v1/models",
    status_code=201,
    response_model=InstallOut,
    responses={
        **_ERRORS,
        202: {
            "model": InstallTaskOut,
            "description": "build_variants=true: checked and accepted; the variants are "
            "built after this answer (Location: the install's record)",
        },
    },
    summary="Install a model bundle (body: a zip of the bundle folder; admin)",
)
async def install_model(
    request: Request,
    principal: Annotated[Principal, Depends(require_admin)],
    build_variants: Annotated[
        bool,
        Query(
            description="build and gate precision variants (minutes): answered 202 once the "
            "bundle passed its checks, the build runs after; poll the Location"
        ),
    ] = False,
    precisions: Annotated[
        str | None,
        Query(
            pattern=r"^(fp16|int8|bf16)(,(fp16|int8|bf16))*$",
            description="variants to build, comma-separated (default: lifecycle.variants)",
        ),
    ] = None,
    trust_gate: Annotated[
        bool,
        Query(
            description="serve the variants on the bundle's own gate.json (one this site "
            "built with `radserve models build-variants`); without it a shipped gate.json "
            "is set aside and no variant serves until gated here"
        ),
    ] = False,
) -> Any:
    """Without ``build_variants`` the bundle is installed before the answer (201), which
    names every file's SHA-256. With it, the bundle is checked and staged (a refused one is
    answered 4xx as without), the answer is 202 with the install's record, and
    ``GET /v1/models/installs/{id}`` says when it is installed and, per variant built,
    whether its gate accepted it and why not (a rejected variant is installed but never
    served)."""
    service = _service(request)
    if precisions and not build_variants:
        raise InvalidRequestError("precisions needs build_variants=true")
    if trust_gate and build_variants:
        raise InvalidRequestError(
            "trust_gate is for a bundle installed as gated; build_variants gates it here"
        )
    path, described_as = await _received_zip(request, service.settings.data_dir)
    try:
        if not build_variants:
            installed = await run_in_threadpool(
                service.lifecycle.install,
                path,
                actor=principal.key_id,
                client=principal.client,
                described_as=described_as,
                trust_shipped_gate=trust_gate,
            )
            return InstallOut(**install_summary(installed))
        staged = await run_in_threadpool(service.lifecycle.stage, path, described_as=described_as)
    finally:
        path.unlink(missing_ok=True)
    task = service.installs.submit(
        staged,
        actor=principal.key_id,
        client=principal.client,
        variants=VariantRequest(precisions=tuple(precisions.split(",")) if precisions else None),
    )
    return JSONResponse(
        InstallTaskOut.of(task).model_dump(mode="json"),
        status_code=202,
        headers={"Location": f"/v1/models/installs/{task.id}"},
    )


@router.get(
    "/v1/models/installs",
    response_model=list[InstallTaskOut],
    responses=_ERRORS,
    summary="Installs answered before they finished (build_variants), newest first",
)
async def installs(
    request: Request, who: Annotated[Principal, Depends(require_read)]
) -> list[InstallTaskOut]:
    tasks = await run_in_threadpool(_service(request).installs.tasks.recent)
    return await run_in_threadpool(lambda: [_install_out(request, who, t) for t in tasks])


def _install_out(request: Request, who: Principal, task: InstallTask) -> InstallTaskOut:
    """An install as ``who`` may see it: who started it only when ``who`` may see that
    key (:func:`shown_actor`; call from a worker thread)."""
    out = InstallTaskOut.of(task)
    actor = shown_actor(request, who, out.actor)
    return out if actor == out.actor else out.model_copy(update={"actor": actor})


@router.get(
    "/v1/models/installs/{install_id}",
    response_model=InstallTaskOut,
    responses=_ERRORS,
    summary="One install's state: queued, building, installed, rejected, failed, interrupted",
)
async def install_state(
    request: Request, install_id: str, who: Annotated[Principal, Depends(require_read)]
) -> InstallTaskOut:
    task = await run_in_threadpool(_service(request).installs.tasks.get, install_id)
    if task is None:
        raise InstallNotFoundError(f"no install {quoted(install_id)}")
    return await run_in_threadpool(_install_out, request, who, task)


@router.get(
    "/v1/models/deployments",
    response_model=list[DeploymentOut],
    responses=_ERRORS,
    summary="Deployment changes, newest first",
)
async def deployment_history(
    request: Request, who: Annotated[Principal, Depends(require_read)], step: str | None = None
) -> list[DeploymentOut]:
    history = await run_in_threadpool(_service(request).lifecycle.deployments.history, step)
    return await run_in_threadpool(
        lambda: [DeploymentOut.of(d, shown_actor(request, who, d.actor)) for d in history]
    )


@router.get(
    "/v1/models/comparisons",
    responses=_ERRORS,
    summary="Running shadow/canary comparison and guardrail record per version",
)
async def comparisons(
    request: Request, _: Annotated[Principal, Depends(require_read)]
) -> list[dict[str, Any]]:
    return [r.summary() for r in _service(request).lifecycle.records()]


@router.get(
    "/v1/models/drift",
    responses=_ERRORS,
    summary="Drift of each model version's inputs and outputs against its reference",
)
async def drift(
    request: Request, _: Annotated[Principal, Depends(require_read)]
) -> list[dict[str, Any]]:
    """Per model version that served a study since the server started: its state (ok,
    warn, alert), reference (how many studies, from where), window, and per feature the
    test (psi, ks, chi2), statistic, p-value and state."""
    return await run_in_threadpool(_service(request).drift.summary)


async def _changed(change: Callable[[], StepDeployment]) -> DeploymentOut:
    """Run one deployment change off the event loop (it warms models and writes the
    database) and answer with the row it recorded."""
    changed = await run_in_threadpool(change)
    return DeploymentOut.of(changed, changed.actor)  # an admin's change: it sees every key


@router.post(
    "/v1/models/{step}/deploy",
    response_model=DeploymentOut,
    responses=_ERRORS,
    summary="Deploy a version as the step's stable, canary or shadow (admin)",
)
async def deploy(
    request: Request,
    step: str,
    body: DeployIn,
    principal: Annotated[Principal, Depends(require_admin)],
) -> DeploymentOut:
    check_deploy_options(step, body.version, Role(body.role), body.percent, body.include_urgent)
    return await _changed(
        lambda: _service(request).lifecycle.deploy(
            step,
            body.version,
            role=Role(body.role),
            percent=body.percent,
            include_urgent=body.include_urgent,
            actor=principal.key_id,
            reason=body.reason,
            client=principal.client,
        )
    )


@router.post(
    "/v1/models/{step}/promote",
    response_model=DeploymentOut,
    responses=_ERRORS,
    summary="The canary becomes stable (admin)",
)
async def promote(
    request: Request,
    step: str,
    body: ChangeIn,
    principal: Annotated[Principal, Depends(require_admin)],
) -> DeploymentOut:
    return await _changed(
        lambda: _service(request).lifecycle.promote(
            step, actor=principal.key_id, reason=body.reason, client=principal.client
        )
    )


@router.post(
    "/v1/models/{step}/rollback",
    response_model=DeploymentOut,
    responses=_ERRORS,
    summary="Drop the canary, or return to the previous stable version (admin)",
)
async def rollback(
    request: Request,
    step: str,
    body: ChangeIn,
    principal: Annotated[Principal, Depends(require_admin)],
) -> DeploymentOut:
    return await _changed(
        lambda: _service(request).lifecycle.rollback(
            step, actor=principal.key_id, reason=body.reason, client=principal.client
        )
    )


@router.post(
    "/v1/models/{step}/undeploy",
    response_model=DeploymentOut,
    responses=_ERRORS,
    summary="Stop the step's shadow (admin; 409 no_shadow when it has none)",
)
async def undeploy(
    request: Request,
    step: str,
    body: UndeployIn,
    principal: Annotated[Principal, Depends(require_admin)],
) -> DeploymentOut:
    """Remove the shadow: no study is sampled for it from now on; stable and canary stay.
    Recorded (a ``deploy`` row with no shadow) and audited as every deployment change."""
    return await _changed(
        lambda: _service(request).lifecycle.undeploy_shadow(
            step, actor=principal.key_id, reason=body.reason, client=principal.client
        )
    )


@router.get(
    "/v1/ops/doctor",
    responses=_ERRORS,
    summary="Environment check (radserve doctor; ports skipped: the server holds them; "
    "the memory of every loaded session)",
    tags=["operations"],
)
async def doctor(
    request: Request, _: Annotated[Principal, Depends(require_admin)]
) -> list[dict[str, Any]]:
    from radserve.lifecycle.doctor import run_doctor

    service = _service(request)

    def check() -> list[dict[str, Any]]:
        serving = {
            (step, version)
            for step, d in service.lifecycle.active().items()
            for version in d.versions()
        } | set(service.catalog.model_versions().items())
        checks = run_doctor(
            service.settings,
            serving=serving,
            check_ports=False,
            sessions=service.catalog.sessions.loaded(),
            providers=service.catalog.serving_providers,
        )
        return [c.as_json() for c in checks]

    return await run_in_threadpool(check)


__all__ = ["router"]
