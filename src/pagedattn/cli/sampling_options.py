"""The sampling options of `pagedattn generate` and `chat`, and the other options both take.

:class:`SamplingOptions` is an option group (see :mod:`pagedattn.cli.option_groups`): each field
is one ``--flag`` of the "Sampling" help panel, its default the flag's default, and a command
receives one instance whose :meth:`SamplingOptions.sampling_params` validates the values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from pagedattn.sampling_params import SamplingParams

SAMPLING = "Sampling"

MaxTokensOption = Annotated[
    int, typer.Option(metavar="N", help="Most tokens to generate.", rich_help_panel=SAMPLING)
]
TemperatureOption = Annotated[
    float,
    typer.Option(
        metavar="T", help="0 = greedy (reproducible); > 0 samples.", rich_help_panel=SAMPLING
    ),
]
TopPOption = Annotated[
    float,
    typer.Option(metavar="P", help="Nucleus sampling mass in (0, 1].", rich_help_panel=SAMPLING),
]
TopKOption = Annotated[
    int,
    typer.Option(
        metavar="K", help="Keep the k most likely tokens; 0 = off.", rich_help_panel=SAMPLING
    ),
]
SeedOption = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="Random seed for sampling (temperature > 0).",
        rich_help_panel=SAMPLING,
    ),
]
IgnoreEosOption = Annotated[
    bool,
    typer.Option(
        "--ignore-eos",
        metavar="",
        help="Keep generating past end-of-sequence.",
        rich_help_panel=SAMPLING,
    ),
]
SystemOption = Annotated[
    str | None, typer.Option(metavar="TEXT", help="System message for the chat template.")
]
StatsOption = Annotated[
    bool,
    typer.Option(
        "--stats",
        metavar="",
        help="Print prefill/decode tok/s, time to first token, peak pages and cached prompt "
        "tokens to stderr after each answer; a warm-up request first loads or compiles the "
        "kernels, timed apart, so the figures are steady-state.",
    ),
]


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling options of one command line, named as ``SamplingParams``' fields; the
    defaults are the flags' (a command may set its own, e.g. ``max_tokens``)."""

    max_tokens: MaxTokensOption = 128
    temperature: TemperatureOption = 0.0
    top_p: TopPOption = 1.0
    top_k: TopKOption = 0
    seed: SeedOption = None
    ignore_eos: IgnoreEosOption = False

    def sampling_params(self) -> SamplingParams:
        """SamplingParams of these options.

        Raises:
            ValueError: a value outside the ranges ``SamplingParams`` documents.
        """
        from pagedattn.sampling_params import SamplingParams

        return SamplingParams(**asdict(self))
