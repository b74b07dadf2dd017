"""Option groups: options several commands share, declared once as the fields of a dataclass.

A group is a dataclass whose every field is annotated ``Annotated[T, typer.Option(...)]`` and
whose default is the option's default, so adding an option to every command that takes the
group is one field. A command takes the group as one parameter annotated with its class;
:func:`option_group` shows typer the group's fields in that parameter's place instead (the help
panels list them in field order) and calls the command with one instance built from the parsed
values.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterable
from typing import Any

Command = Callable[..., Any]


def option_group(
    group: type[Any], *, omit: Iterable[str] = (), **defaults: Any
) -> Callable[[Command], Command]:
    """A decorator that expands the command's ``group``-annotated parameter into the group's
    fields (apply it below ``app.command``).

    The wrapper's ``__signature__`` and ``__annotations__`` hold the command's other parameters
    and the fields, with annotations resolved (typer reads both), every one keyword-only.

    Args:
        group: the dataclass of the options.
        omit: fields this command does not offer; the instance keeps their defaults.
        defaults: this command's default for some fields, e.g. ``max_tokens=256``.

    Raises:
        TypeError: ``omit`` or ``defaults`` names no field; the command has no parameter
            annotated ``group``, or one that a field's name would shadow.
    """
    fields = dataclasses.fields(group)
    names = {f.name for f in fields}
    omitted = set(omit)
    unknown = (omitted | set(defaults)) - names
    if unknown:
        raise TypeError(f"{group.__name__} has no field(s) {sorted(unknown)}")
    hints = typing.get_type_hints(group, include_extras=True)
    offered = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=defaults.get(f.name, f.default),
            annotation=hints[f.name],
        )
        for f in fields
        if f.name not in omitted
    ]

    def decorate(command: Command) -> Command:
        command_hints = typing.get_type_hints(command, include_extras=True)
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=command_hints[p.name])
            for p in inspect.signature(command).parameters.values()
        ]
        targets = [i for i, p in enumerate(own) if p.annotation is group]
        if len(targets) != 1:
            raise TypeError(f"{command.__name__}: expected one parameter of type {group.__name__}")
        [index] = targets
        target = own[index].name
        shadowed = {p.name for p in offered} & {p.name for p in own}
        if shadowed:
            raise TypeError(f"{command.__name__}: parameter(s) {sorted(shadowed)} shadow options")
        parameters = [*own[:index], *offered, *own[index + 1 :]]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            values = {p.name: kwargs.pop(p.name) for p in offered}
            return command(**kwargs, **{target: group(**values)})

        wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate
