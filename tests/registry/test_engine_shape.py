"""Engine shapes (registry.calibrations.engine_shape, core.speed.shared_curves): engines that differ only in
their draft's weights and languages share one step model; host, k, draft vocabulary and speed knobs part them."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyspec.core.speed import shared_curves


def test_shared_curves_average_each_batch_over_a_shape_and_leave_the_rest() -> None:
    curves = {"en": ("a", {1: 0.075, 4: 0.120}), "fr": ("a", {1: 0.104}), "ru": ("b", {1: 0.090}),
              "plain": (None, {1: 0.055}), "new": ("a", {})}
    shared = shared_curves(curves)
    assert shared["en"] == shared["fr"] == shared["new"] == {1: pytest.approx(0.0895), 4: pytest.approx(0.120)}
    assert shared["ru"] == {1: 0.090} and shared["plain"] == {1: 0.055}
    assert shared_curves({}) == {}


@pytest.fixture()
def small_vocab_draft(verifier, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from polyspec.models.draft_build import create_draft
    from polyspec.models.vocab_ref import english_top_token_ids

    out = tmp_path_factory.mktemp("drafts") / "small"
    return create_draft(verifier.path, out, t2d_token_ids=english_top_token_ids(verifier.path, n=1024),
                        num_layers=1, seed=0)


def test_shapes_pool_same_engines_on_one_host_and_part_the_others(reg, base_draft, base_draft_dir, verifier_rec,
                                                                  small_vocab_draft) -> None:
    fr = reg.import_draft(base_draft_dir, verifier=verifier_rec.name, name="fr-draft", languages=["fr"],
                          status="active")
    small = reg.import_draft(small_vocab_draft, verifier=verifier_rec.name, name="ru-draft", languages=["ru"],
                             status="active")
    knobs = {"dtype": "float32", "max_model_len": 2048}
    local = "http://127.0.0.1:{}"
    reg.deploy(base_draft.ref, name="en", url=local.format(9101), languages=["en"], default=True,
               launch={"port": 9101, **knobs})
    reg.deploy(fr.ref, name="fr", url=local.format(9102), languages=["fr"], launch={"port": 9102, **knobs})
    reg.deploy(fr.ref, name="fr-elsewhere", url="http://10.0.0.5:8000", languages=["fr"], launch=knobs)
    reg.deploy(fr.ref, name="fr-bf16", url=local.format(9103), languages=["fr"],
               launch={**knobs, "dtype": "bfloat16"})
    reg.deploy(fr.ref, name="fr-k2", url=local.format(9104), languages=["fr"], launch={**knobs, "k": 2})
    reg.deploy(small.ref, name="ru", url=local.format(9105), languages=["ru"], launch=knobs)
    reg.deploy(None, name="plain", url=local.format(9106), languages=["en"], launch=knobs)
    reg.deploy(fr.ref, name="not-up", languages=["fr"], launch=knobs)
    shapes = {d.name: d.step_shape for d in reg.deployments()}
    assert shapes["en"] == shapes["fr"]  # only the port and the draft's weights differ
    parted = [shapes[n] for n in ("en", "fr-elsewhere", "fr-bf16", "fr-k2", "ru", "plain")]
    assert None not in parted and len(set(parted)) == len(parted)
    assert shapes["not-up"] is None  # no URL, no host: its own shape

    # `deploy plan` reads the shared curve: French stays on its draft although its engine calibrated slower.
    reg.add_evaluation(base_draft.ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.45, 0.2, 0.1],
                       method="offline", num_prompts=160)
    reg.add_evaluation(fr.ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.55, 0.3, 0.15],
                       method="offline", num_prompts=160)
    for name, step in (("en", 0.075), ("fr", 0.104)):
        reg.record_calibration(name, [{"batch_size": 1, "step_s": step, "tokens_per_s": 20, "requests": 3}])
    by = {lp.language: lp for lp in reg.plan(record=False).languages}
    assert by["fr"].best.deployment == "fr"
    steps = {o.deployment: o.step_s for o in by["fr"].options}
    assert steps["en"] == steps["fr"] == pytest.approx(0.0895)


def test_a_url_without_a_host_is_refused_and_a_stored_one_has_no_shape(reg, base_draft) -> None:
    """`deploy` refuses a URL that names no host; one that is stored anyway (an imported registry, an older
    version) leaves its deployment without a shape instead of breaking every view of the registry."""
    from polyspec.registry import RegistryError
    from polyspec.registry.schema import Deployment

    for bad in ("http://[bad", "http://", "https://:8000"):
        with pytest.raises(RegistryError, match="names no host"):
            reg.deploy(base_draft.ref, name="en", url=bad, languages=["en"])
    reg.deploy(base_draft.ref, name="en", url="http://127.0.0.1:9101", languages=["en"], default=True)
    with reg.session(write=True) as s:
        s.query(Deployment).filter_by(name="en").one().url = "http://[bad"
    [view] = reg.deployments()
    assert view.url == "http://[bad" and view.step_shape is None
