"""The symbols an object file defines, read from its ELF symbol table.

Numba registers the functions and globals a cached kernel defines by parsing the kernel's
whole LLVM bitcode into a module (about 17 MiB for the largest kernels, kept until the process
ends: :mod:`pagedattn.kernels.numba_runtime`). The machine code loaded beside it is an ELF
object (Linux) whose symbol table lists the same names, at the cost of reading a few KiB.

ELF: https://refspecs.linuxfoundation.org/elf/gabi4+/ch4.symtab.html (64-bit, little-endian:
x86-64 and AArch64 Linux). Anything else (32-bit, big-endian, Mach-O, COFF, a malformed file)
gives None, and the caller parses the bitcode as Numba does.
"""

from __future__ import annotations

import struct

ELF_MAGIC = b"\x7fELF"
ELFCLASS64, ELFDATA2LSB = 2, 1
SHT_SYMTAB = 2
SHN_UNDEF = 0
STT_SECTION, STT_FILE = 3, 4  # symbol types that name no function or variable

_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym


def defined_symbols(object_code: bytes) -> frozenset[str] | None:
    """Names of the functions and variables ``object_code`` defines (every binding: global,
    weak and local), or None when it is not a 64-bit little-endian ELF object or is
    malformed."""
    if object_code[:4] != ELF_MAGIC or object_code[4:6] != bytes((ELFCLASS64, ELFDATA2LSB)):
        return None
    try:
        (section_offset,) = struct.unpack_from("<Q", object_code, 0x28)
        entry_size, count = struct.unpack_from("<HH", object_code, 0x3A)
        if entry_size != _SECTION.size:
            return None
        sections = [
            _SECTION.unpack_from(object_code, section_offset + i * entry_size) for i in range(count)
        ]
        names: set[str] = set()
        for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
            if kind != SHT_SYMTAB:
                continue
            if symbol_size != _SYMBOL.size or link >= count:
                return None
            strings = sections[link][4]
            for i in range(size // symbol_size):
                name, info, _, section, _, _ = _SYMBOL.unpack_from(
                    object_code, offset + i * symbol_size
                )
                if section == SHN_UNDEF or info & 0xF in (STT_SECTION, STT_FILE) or not name:
                    continue
                start = strings + name
                end = object_code.index(b"\0", start)
                names.add(object_code[start:end].decode("utf-8"))
    except (struct.error, ValueError, UnicodeDecodeError):
        return None
    return frozenset(names)
