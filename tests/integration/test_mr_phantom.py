"""The multi-sequence MR phantom: T1-, T2- and FLAIR-like series of the CT phantom's anatomy.

Read back from the written files: each sequence is an MR series on the CT's grid and
Frame of Reference, its Series Description read by exactly its own series rule, its
contrast what the sequence shows, and zero outside the body.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from tests.factories.dciodvfy import dciodvfy_report

from radserve.importers.channel_series import NAMED_SERIES
from radserve.ingest import discover_series, load_series
from radserve.phantom import PhantomSpec, generate_phantom
from radserve.phantom.anatomy import NON_BODY_TISSUES, Tissue
from radserve.phantom.mr import SEQUENCES, write_mr_series


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    phantom = generate_phantom(PhantomSpec.random(0, small=True))
    out = tmp_path_factory.mktemp("mr")
    paths = {sequence: write_mr_series(phantom, out, sequence) for sequence in SEQUENCES}
    headers = {h.series_description: h for h in discover_series(out)}
    volumes = {s: load_series(headers[SEQUENCES[s].description]).volume for s in SEQUENCES}
    return phantom, paths, headers, volumes


def test_each_sequence_is_an_mr_series_on_the_ct_grid(study) -> None:
    phantom, _paths, headers, volumes = study
    assert {h.modality for h in headers.values()} == {"MR"}
    for volume in volumes.values():
        assert volume.same_geometry(phantom.ct)
        assert volume.frame_of_reference_uid == phantom.ct.frame_of_reference_uid
    rules = {name: re.compile(str(NAMED_SERIES[name].series_description)) for name in SEQUENCES}
    for name, rule in rules.items():
        read = [s for s, seq in SEQUENCES.items() if rule.search(seq.description)]
        assert read == [name], (name, read)


def test_the_contrast_is_the_sequence_s(study) -> None:
    phantom, _paths, _headers, volumes = study
    tissue = phantom.tissue.array

    def mean(sequence: str, what: Tissue) -> float:
        return float(volumes[sequence].array[tissue == what].mean())

    assert mean("T1", Tissue.FAT) > 1.5 * mean("T1", Tissue.MUSCLE)  # fat bright on T1
    assert mean("T2", Tissue.CANAL) > 3 * mean("T1", Tissue.CANAL)  # fluid bright on T2
    assert mean("FLAIR", Tissue.CANAL) < 0.2 * mean("T2", Tissue.CANAL)  # and dark on FLAIR
    outside = np.isin(tissue, [int(t) for t in NON_BODY_TISSUES])
    for volume in volumes.values():
        assert not volume.array[outside].any() and volume.array[~outside].min() > 0
    lesions = phantom.lesions.array > 0
    assert lesions.any()
    assert volumes["T2"].array[lesions].mean() > 2 * volumes["T1"].array[lesions].mean()


@pytest.mark.tools
@pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy not installed")
def test_dciodvfy_reports_no_errors_on_the_mr(study) -> None:
    _phantom, paths, _headers, _volumes = study
    for files in paths.values():
        report = dciodvfy_report(files[5])
        assert "MRImage" in report
        assert not [line for line in report.splitlines() if "Error" in line], report
