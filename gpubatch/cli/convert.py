"""``gpubatch convert SRC DST --to FORMAT``: a thin adapter over :func:`gpubatch.api.convert`."""

from __future__ import annotations

import json

import click

from .options import FormatOption, device_options, held_back, pipeline_options, run_options, standard_output


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src", type=str)
@click.argument("dst", type=str)
@click.option("--to", "to", cls=FormatOption, required=True, help="Output format.")
@click.option("--resize-shorter", type=click.IntRange(min=1), default=None, metavar="N",
              help="Resize so the shorter side is N pixels (antialiased bilinear).")
@click.option("--center-crop", type=click.IntRange(min=1), default=None, metavar="N",
              help="Crop the central NxN window (after --resize-shorter).")
@click.option("--quality", type=click.IntRange(1, 100), default=None, metavar="Q",
              help="JPEG quality of re-encoded images  [default: 95]; given alone, it re-encodes JPEGs.")
@click.option("--limit", type=click.IntRange(min=0), default=None, metavar="N", help="Convert the first N records only.")
@click.option("--shuffle", is_flag=True, help="Write records in a random order (see --seed).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --shuffle and of random clip positions.")
@click.option("--frames", default=None, metavar="MODE",
              help="Video to images: every:N, fps:F, uniform:K or keyframes (keys <clip>/<frame:06d>).")
@click.option("--clip-length", type=click.IntRange(min=1), default=None, metavar="T",
              help="Video to clips of T frames, one record each (see --clip-format).")
@click.option("--clip-stride", type=click.IntRange(min=1), default=None, metavar="S",
              help="Frames between clip starts  [default: T x --frame-step, clips side by side]")
@click.option("--frame-step", type=click.IntRange(min=1), default=None, metavar="D",
              help="Frames between a clip's frames  [default: 1]")
@click.option("--clip-positions", type=click.Choice(["stride", "uniform", "random"]), default=None,
              help="Where clips start: every S frames, K spread evenly, or K at random (--seed)  [default: stride]")
@click.option("--clips-per-video", type=click.IntRange(min=1), default=None, metavar="K",
              help="Clips per video for uniform and random positions (at most K for stride).")
@click.option("--clip-format", type=click.Choice(["npy", "jpeg", "png", "mp4"]), default=None,
              help="A clip as one uint8 (T,H,W,3) .npy, one image member per frame, or an MP4  [default: npy]")
@click.option("--video-codec", default=None, metavar="CODEC",
              help="Re-encode videos (CPU: h264, hevc, av1, vp9) at the source's resolution unless resized.")
@click.option("--fps", type=float, default=None, metavar="F", help="Re-encoded videos at F frames per second.")
@click.option("--sample-rate", type=click.IntRange(1000, 768000), default=None, metavar="R",
              help="Audio: resample to R Hz (soxr on the CPU, a polyphase kernel on the GPU).")
@click.option("--mono", is_flag=True, default=None, help="Audio: mix the channels down to one.")
@click.option("--duration", type=click.FloatRange(min=0.001), default=None, metavar="S",
              help="Audio: cut or pad every clip to S seconds (see --pad).")
@click.option("--pad", type=click.Choice(["zero", "repeat"]), default=None,
              help="Audio: how --duration pads a shorter clip  [default: zero]")
@click.option("--audio-format", type=click.Choice(["keep", "flac", "wav", "npy"]), default=None,
              help="Audio outputs as FLAC, WAV or float32 .npy  [default: keep; lossy codecs become FLAC]")
@click.option("--features", default=None, metavar="SPEC",
              help="Audio to float16 .npy features: \"log-mel(n_mels=80)\", mel(...), mfcc(n_mfcc=40), spectrogram(...).")
@click.option("--path-column", default=None, metavar="NAME", help="Audio CSV: the column of file paths.")
@click.option("--label-column", default=None, metavar="NAME", help="Audio CSV: the column of labels.")
@pipeline_options
@device_options
@run_options
def convert(src: str, dst: str, to: str, as_json: bool, quiet: bool, verbose: bool, **opts) -> None:
    """Convert the dataset at SRC into FORMAT at DST.

    Without pixel or audio options the encoded bytes pass through untouched. With --resize-shorter,
    --center-crop, --quality or --image-format the images are decoded, transformed and re-encoded
    (on the GPU when --device resolves to one); video takes --frames or the clip options, audio
    --sample-rate, --mono, --duration, --audio-format and --features. DST appears only when the run completes; SRC is never
    modified. SRC may be a quoted pattern of shards ('shards/train-*.tar', 'train-{000..009}.tar').
    """
    from ..api import ConvertRequest
    from ..api import convert as run
    from ..report.console import console, esc
    from ..report.progress import progress_bar
    from ..report.summary import render_summary

    req = ConvertRequest(src=src, dst=dst, to=to, **opts)
    con = console()

    def said(device) -> None:
        if not quiet:
            con.print(f"[dim]device:[/] {esc(device)}  [dim]({esc(device.reason)})[/]")

    with held_back() as noise, progress_bar(f"convert -> {to}", enabled=not quiet) as start:
        summary = run(req, progress=start, on_device=said)
    summary.library_messages = noise.total
    if noise.summary_line() and not verbose:
        summary.warnings.append(noise.summary_line())
    if not quiet:
        render_summary(summary)
    if verbose:
        noise.render()
    if as_json:
        with standard_output(f"; {summary.dst} was written"):
            click.echo(json.dumps(summary.as_dict(), indent=2))
