"""Registries as the one source: every registered op has a GPU/CPU parity case and an independent reference,
and the step kernel takes its codes from the Python side (these run without a GPU; the cases they count run
on one)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from gpubatch.engine.ops import OPS
from tests.audio import test_audio_cpu, test_audio_gpu
from tests.engine import test_codecs_ops, test_gpu, test_gpu_ops, test_ops_cpu, test_rng
from tests.video import test_video_cpu, test_video_gpu

# op -> the CPU tests that check it against something it does not share code with: PIL, the published
# definition (torchvision's spaces, formulas), identities or the pixels that moved
REFERENCES = {
    "affine": (test_ops_cpu.test_warp_identities, test_ops_cpu.test_boxes_move_with_pixels),
    "autoaugment": (test_ops_cpu.test_policy_spaces_are_the_published_ones,),
    "autocontrast": (test_ops_cpu.test_autocontrast_and_sharpness_match_pil,),
    "brightness": (test_ops_cpu.test_colour_identities,),
    "random_crop": (test_codecs_ops.test_random_crop_takes_a_window_inside_the_image,),
    "center_crop": (test_codecs_ops.test_resize_shorter_and_center_crop_sizes,
                    test_codecs_ops.test_center_crop_pads_small_images),
    "color_jitter": (test_ops_cpu.test_colour_policies_are_their_single_ops_in_the_drawn_order,),
    "contrast": (test_ops_cpu.test_colour_identities,),
    "equalize": (test_ops_cpu.test_matches_pil_exactly,),
    "expand": (test_ops_cpu.test_boxes_move_with_pixels,),
    "flip": (test_ops_cpu.test_boxes_move_with_pixels,),
    "gaussian_blur": (test_ops_cpu.test_blur_noise_erase,),
    "gaussian_noise": (test_ops_cpu.test_blur_noise_erase,),
    "grayscale": (test_ops_cpu.test_colour_identities,),
    "hue": (test_ops_cpu.test_colour_identities,),
    "invert": (test_ops_cpu.test_matches_pil_exactly,),
    "jpeg_quality": (test_ops_cpu.test_jpeg_quality_is_pillows_round_trip,),
    "normalize": (test_ops_cpu.test_normalize_table_equals_the_formula,),
    "pad": (test_ops_cpu.test_boxes_move_with_pixels,),
    "perspective": (test_ops_cpu.test_boxes_move_with_pixels,),
    "photometric_distort": (test_ops_cpu.test_colour_policies_are_their_single_ops_in_the_drawn_order,),
    "posterize": (test_ops_cpu.test_matches_pil_exactly,),
    "randaugment": (test_ops_cpu.test_policy_spaces_are_the_published_ones, test_ops_cpu.test_boxes_move_with_pixels),
    "random_erasing": (test_ops_cpu.test_blur_noise_erase,),
    "random_iou_crop": (test_ops_cpu.test_iou_crop_keeps_an_overlapping_box,),
    "random_resized_crop": (test_rng.test_random_resized_crop_params_are_valid_and_reproducible,),
    "resize": (test_codecs_ops.test_resize_antialiases_when_downscaling,),
    "resize_shorter": (test_codecs_ops.test_resize_shorter_and_center_crop_sizes,),
    "rotate": (test_ops_cpu.test_warp_identities,),
    "rotate90": (test_ops_cpu.test_rotate90_is_exact,),
    "saturation": (test_ops_cpu.test_colour_identities,),
    "sharpness": (test_ops_cpu.test_autocontrast_and_sharpness_match_pil,),
    "solarize": (test_ops_cpu.test_matches_pil_exactly,),
    "trivialaugment": (test_ops_cpu.test_policy_spaces_are_the_published_ones, test_ops_cpu.test_boxes_move_with_pixels),
    # the temporal ops pick a video's frames before decoding: their sampling math, and a clip's one draw
    "clip": (test_video_cpu.test_clip_samplers_and_their_draws,),
    "random_clip": (test_video_cpu.test_clip_samplers_and_their_draws,
                    test_video_cpu.test_augment_draws_one_set_of_parameters_per_clip),
    # audio: the published definitions (Whisper's log-mel, librosa's filters and MFCC), soxr, identities
    "resample": (test_audio_cpu.test_resampling_against_soxr_on_a_tone,),
    "speed": (test_audio_cpu.test_speed_and_fixed_lengths_follow_the_drawn_sizes,),
    "mono": (test_audio_cpu.test_mono_gain_shift_crop_and_lengths_are_their_definitions,),
    "gain": (test_audio_cpu.test_mono_gain_shift_crop_and_lengths_are_their_definitions,),
    "time_shift": (test_audio_cpu.test_mono_gain_shift_crop_and_lengths_are_their_definitions,),
    "time_crop": (test_audio_cpu.test_mono_gain_shift_crop_and_lengths_are_their_definitions,),
    "fix_duration": (test_audio_cpu.test_mono_gain_shift_crop_and_lengths_are_their_definitions,),
    "add_noise": (test_audio_cpu.test_add_noise_reaches_its_snr,),
    "spectrogram": (test_audio_cpu.test_spectrogram_frames_and_padding,),
    "mel": (test_audio_cpu.test_spectrogram_frames_and_padding, test_audio_cpu.test_mel_filters_match_the_reference_bank_and_128_bins),
    "log_mel": (test_audio_cpu.test_log_mel_is_whispers_definition,),
    "mfcc": (test_audio_cpu.test_mfcc_is_the_orthonormal_dct_of_power_to_db,),
    "freq_mask": (test_audio_cpu.test_spec_augment_masks_take_features,),
    "time_mask": (test_audio_cpu.test_spec_augment_masks_take_features,),
}


def _names(chains) -> set[str]:
    return {op.name for chain in chains for op in chain}


def test_every_registered_op_has_a_gpu_parity_case():
    """A new op must join a chain that the GPU tests compare with the CPU (test_gpu_ops.OPS, or the window
    chains of test_gpu.CHAINS)."""
    covered = _names(chain for chain, _ in test_gpu_ops.OPS.values())
    covered |= _names([test_gpu_ops.JPEG_CHAIN, test_gpu_ops.SSD_CHAIN]) | _names(test_gpu.CHAINS.values())
    covered |= set(test_video_gpu.TEMPORAL_CHAINS)  # the same frames picked on the GPU as on the CPU
    from gpubatch.engine.spec import parse_chain

    covered |= _names(parse_chain(c) for c in test_audio_gpu.AUDIO_CHAINS.values())  # audio: device vs host kernels
    assert not set(OPS) - covered, f"ops with no GPU/CPU parity case: {sorted(set(OPS) - covered)}"


def test_every_registered_op_has_an_independent_reference():
    assert not set(OPS) - set(REFERENCES), f"ops with no independent reference: {sorted(set(OPS) - set(REFERENCES))}"
    assert not set(REFERENCES) - set(OPS), "references for ops no longer registered"
    for name, tests in REFERENCES.items():
        assert all(callable(t) and t.__name__.startswith("test_") for t in tests), name


def test_step_kernel_takes_its_codes_from_python():
    """kernels/step.cu declares no code numbers of its own, uses only codes pixel.py defines, and every code
    but COPY has its branch there and in the NumPy twin."""
    from gpubatch.engine.kernels import _DIR, source
    from gpubatch.engine.ops.pixel import CODE_NAMES, MAX_KERNEL, NPRM, Code, Step, cuda_header, step_cpu

    text = re.sub(r"//[^\n]*", "", (_DIR / "step.cu").read_text())  # (code, not comments)
    assert not re.search(r"\benum\s+Code\b|#define\s+(NPRM|MAXK)\b", text)
    used = set(re.findall(r"case\s+([A-Z_]+)\s*:", text)) | set(re.findall(r"code\s*==\s*([A-Z_]+)", text))
    names = {c.name for c in Code}
    assert used <= names and names - used == {"COPY"}
    assert source("step").startswith(cuda_header()) and f"MAXK {MAX_KERNEL}" in cuda_header()
    assert [c.name.lower() for c in Code] == list(CODE_NAMES) and f"NPRM {NPRM}" in cuda_header()
    img = np.full((6, 5, 3), 100, np.uint8)
    for code in Code:  # the NumPy twin knows each code (arguments that keep the image valid)
        prm = np.zeros(NPRM, np.float32)
        prm[0], prm[1:4] = code, (1.0, 1.0, 1.0)
        if code == Code.WARP:
            prm[1:10] = np.eye(3).ravel()  # the identity map
        if code == Code.BLUR:
            prm[1:5] = (3, 3, 1.0, 1.0)  # kernel sizes and sigmas
        assert step_cpu(img, Step(tuple(float(v) for v in prm))).dtype == np.uint8, code.name


@pytest.mark.parametrize("fmt", ["folder", "lmdb", "tfrecord", "recordio", "coco", "webdataset"])
def test_cli_format_names_come_from_the_registry(fmt):
    """``--to`` and ``--from`` offer the format registry's names, read from it, not a copy."""
    import click

    from gpubatch.cli import cli as main
    from gpubatch.formats import FORMATS, format_names

    ctx = click.Context(main)
    for command, option in (("convert", "to"), ("convert", "from_format"), ("augment", "to")):
        param = next(p for p in main.get_command(ctx, command).params if p.name == option)
        assert list(param.type.choices) == format_names() == sorted(FORMATS), (command, option)
    assert fmt in format_names()


def test_a_kernel_source_carries_its_headers_text():
    """CuPy keys its disk cache of compiled modules by the source text: a module's source holds the text
    of this folder's headers it includes, so changing a header alone compiles the module again."""
    from gpubatch.engine.kernels import _DIR, source

    header = (_DIR / "common.cuh").read_text()
    body = header.split("#pragma once", 1)[1].strip()
    for name in ("audio", "resample", "step", "jpeg"):
        text = source(name)
        assert '#include "common.cuh"' not in text and body in text and "#pragma once" not in text, name
    assert "#include <cuda_fp16.h>" in source("resample")  # (the toolkit's headers stay includes)
