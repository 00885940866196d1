#!/usr/bin/env python3
"""Blank out the GPU code for unwanted architectures inside an ELF shared library.

The output file has exactly the same size and ELF layout as the input (every
ELF header, section, symbol and host pointer is unchanged); only bytes inside
the fatbin containers of the .nv_fatbin section change, and they change into
(almost all) zeros, so the file compresses very well with xz / zstd.

Modes (--mode):
  compact (default) in each fatbin container the kept entries (header and
          payload, byte-for-byte) are moved to the front, the container's
          fat_size is reduced to cover only them and the freed tail is zeroed.
          Every container stays at its original address (the host wrappers in
          .nvFatBinSegment point there), so it is a normal fatbin that holds
          only the kept architectures, as if nvcc had been run for them alone.
          cuobjdump --list-elf / -xelf work on the result.
  stub    every entry header is kept byte-for-byte; the payload of each dropped
          entry becomes a valid zstd frame of the same compressed length that
          decompresses to the stated number of zero bytes.  cuobjdump
          --list-elf then fails with "Invalid ELF" (it decompresses and parses
          every entry, even to list them).
  zero    every entry header is kept; the payload of each dropped entry is
          overwritten with zeros.  cuobjdump --list-elf fails with
          "Uncompress failed".

Fatbin layout used here (little endian; verified on libtransformer_engine.so
from transformer-engine-cu13 2.20.2 against cuobjdump 13.x):

  container header (16 bytes)
    0x00 u32 magic        0xBA55ED50
    0x04 u16 version      1
    0x06 u16 header_size  16 (offset of the first entry)
    0x08 u64 fat_size     bytes of entries that follow the header

  entry header (header_size bytes: 64, or 112/120 for sm_100+ entries,
  which append an option block after the first 64 bytes)
    0x00 u16 kind         1 = PTX, 2 = ELF (cubin)
    0x02 u16 version      0x0101
    0x04 u32 header_size  offset of the payload from the entry start
    0x08 u64 payload_size padded payload size (multiple of 8); the next
                          entry starts at entry + header_size + payload_size
    0x10 u32 data_size    exact compressed payload size (0 when the payload
                          is stored uncompressed, flag 0x8000 clear)
    0x14 u32 unknown      0, or 0x40 when the extended block is present
    0x18 u16 minor, u16 major  code version (here 8, 1)
    0x1c u32 arch         SM number: 75, 80, 89, 90, 100, 103, 107, 120 ...
    0x20 u32 name_offset  (0 here)
    0x24 u32 name_size    (0 here)
    0x28 u64 flags        0x1 64-bit, 0x10 linux host, 0x8000 zstd payload,
                          0x100000 arch-specific ("sm_90a", "sm_100a")
    0x30 u64 unknown      0
    0x38 u64 uncompressed payload size (cubin/PTX size after zstd; 0 when
                          the payload is stored uncompressed)

Containers are searched in every section whose name contains "fatbin"
(.nv_fatbin; __nv_relfatbin in -rdc builds) or that starts with the magic.

Host-side registration: .nvFatBinSegment holds one 24-byte
__fatBinC_Wrapper_t per container {u32 magic 0x466243B1, u32 version,
u64 data (address of the container), u64 filename_or_fatbins}; the script
checks that every wrapper points at a container it parsed.
"""

# Vendored here unchanged except for this note: te-slim is a tool our team wrote for shipping Transformer
# Engine's core library to offline GPU machines with a small upload limit (first used 2026-11-29).
# scripts/prepare_gpu_bundle.sh runs it. It keeps its own style, so ruff skips it (pyproject.toml).

import argparse
import collections
import hashlib
import mmap
import os
import shutil
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
WRAPPER_MAGIC = 0x466243B1
KIND_NAMES = {1: "PTX", 2: "ELF"}
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_ZSTD = 0x8000
ENTRY_FMT = "<HHIQIIHHIIIQQQ"  # 64-byte base entry header
ENTRY_BASE = struct.calcsize(ENTRY_FMT)
assert ENTRY_BASE == 64


class FormatError(Exception):
    pass


# --------------------------------------------------------------------------
# ELF
# --------------------------------------------------------------------------
def read_sections(m):
    if m[:4] != b"\x7fELF":
        raise FormatError("not an ELF file")
    if m[4] != 2 or m[5] != 1:
        raise FormatError("only ELF64 little-endian is supported")
    (e_shoff,) = struct.unpack_from("<Q", m, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", m, 0x3A)
    if e_shoff == 0 or e_shnum == 0:
        raise FormatError("ELF has no section headers")
    raw = []
    for i in range(e_shnum):
        o = e_shoff + i * e_shentsize
        (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size,
         sh_link, sh_info, sh_addralign, sh_entsize) = struct.unpack_from("<IIQQQQIIQQ", m, o)
        raw.append((sh_name, sh_type, sh_addr, sh_offset, sh_size))
    stroff = raw[e_shstrndx][3]
    secs = []
    for (nm, typ, addr, off, size) in raw:
        end = m.find(b"\0", stroff + nm)
        name = m[stroff + nm:end].decode("ascii", "replace")
        secs.append(dict(name=name, type=typ, addr=addr, offset=off, size=size))
    return secs


# --------------------------------------------------------------------------
# fatbin
# --------------------------------------------------------------------------
def arch_label(kind, arch, flags):
    lab = "%s_%d%s" % ("compute" if kind == 1 else "sm", arch,
                       "a" if flags & FLAG_ARCH_SPECIFIC else "")
    return lab


def parse_containers(m, start, end, secname):
    """Parse all fatbin containers in [start, end). Raise on anything odd."""
    containers = []
    pos = start
    while pos < end:
        # tolerate zero padding between containers (alignment)
        if m[pos:pos + 4] != struct.pack("<I", FATBIN_MAGIC):
            nxt = pos
            while nxt < end and m[nxt] == 0:
                nxt += 1
            if nxt == end:
                break  # trailing zero padding
            if m[nxt:nxt + 4] != struct.pack("<I", FATBIN_MAGIC):
                raise FormatError("%s: no fatbin magic at file offset 0x%x" % (secname, nxt))
            pos = nxt
        magic, version, hsize, fsize = struct.unpack_from("<IHHQ", m, pos)
        if version != 1 or hsize < 16:
            raise FormatError("%s: container at 0x%x: version %d header_size %d unexpected"
                              % (secname, pos, version, hsize))
        cstart, cend = pos, pos + hsize + fsize
        if cend > end:
            raise FormatError("%s: container at 0x%x runs past section end" % (secname, pos))
        entries = []
        e = pos + hsize
        while e < cend:
            if e + ENTRY_BASE > cend:
                raise FormatError("container 0x%x: truncated entry header at 0x%x" % (cstart, e))
            (kind, ever, ehsize, psize, dsize, x14, minor, major, arch,
             name_off, name_size, flags, x30, usize) = struct.unpack_from(ENTRY_FMT, m, e)
            if kind not in KIND_NAMES:
                raise FormatError("entry at 0x%x: unknown kind %d" % (e, kind))
            if ehsize < ENTRY_BASE or ehsize > 4096:
                raise FormatError("entry at 0x%x: header size %d unexpected" % (e, ehsize))
            if dsize > psize:
                raise FormatError("entry at 0x%x: data size %d > padded size %d" % (e, dsize, psize))
            if e + ehsize + psize > cend:
                raise FormatError("entry at 0x%x: payload runs past container end" % e)
            if not (0 < arch < 1000):
                raise FormatError("entry at 0x%x: implausible arch %d" % (e, arch))
            entries.append(dict(offset=e, kind=kind, header_size=ehsize, payload_size=psize,
                                data_size=dsize, arch=arch, flags=flags, usize=usize,
                                code_version=(major, minor),
                                label=arch_label(kind, arch, flags)))
            e += ehsize + psize
        if e != cend:
            raise FormatError("container 0x%x: entries end at 0x%x, header says 0x%x"
                              % (cstart, e, cend))
        containers.append(dict(offset=cstart, end=cend, entries=entries, section=secname))
        pos = cend
    return containers


def find_fatbins(m, secs):
    containers = []
    for s in secs:
        if s["type"] == 8 or s["size"] == 0:  # SHT_NOBITS
            continue
        if s["name"] == ".nvFatBinSegment":
            continue  # wrappers, checked separately
        head = m[s["offset"]:s["offset"] + 4]
        is_fatbin_name = "fatbin" in s["name"].lower()
        if head == struct.pack("<I", FATBIN_MAGIC) or is_fatbin_name:
            containers += parse_containers(m, s["offset"], s["offset"] + s["size"], s["name"])
    # Any stray fatbin magic outside the parsed ranges would be GPU code we do
    # not understand -> report it (it is left untouched).
    stray = []
    magic = struct.pack("<I", FATBIN_MAGIC)
    covered = sorted((c["offset"], c["end"]) for c in containers)
    i = m.find(magic)
    while i != -1:
        if not any(a <= i < b for a, b in covered):
            stray.append(i)
        i = m.find(magic, i + 1)
    return containers, stray


def check_wrappers(m, secs, containers):
    """Every __fatBinC_Wrapper_t in .nvFatBinSegment must point at a container."""
    seg = [s for s in secs if s["name"] == ".nvFatBinSegment" and s["type"] != 8]
    if not seg:
        return None
    s = seg[0]
    # map virtual address -> file offset through the section table
    def va2off(va):
        for t in secs:
            if t["addr"] and t["type"] != 8 and t["addr"] <= va < t["addr"] + t["size"]:
                return va - t["addr"] + t["offset"]
        return None
    starts = {c["offset"] for c in containers}
    n = s["size"] // 24
    bad = []
    for i in range(n):
        mg, ver, data, _ = struct.unpack_from("<IIQQ", m, s["offset"] + 24 * i)
        if mg != WRAPPER_MAGIC:
            bad.append((i, "magic 0x%x" % mg))
            continue
        off = va2off(data)
        if off not in starts:
            bad.append((i, "data 0x%x -> %s" % (data, off)))
    return n, bad


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_BLOCK_MAX = 128 * 1024


def zstd_zero_stub(csize, usize):
    """A single valid zstd frame, exactly `csize` bytes long, decompressing to
    `usize` zero bytes (frame header with content size, raw blocks of zeros,
    then RLE blocks of 0x00; no checksum).  None if impossible."""
    if usize < 1:
        return None
    if usize < 2 ** 32:  # Single_Segment, FCS field 4 bytes
        hdr = ZSTD_MAGIC + bytes([0xA0]) + struct.pack("<I", usize)
    else:                # Single_Segment, FCS field 8 bytes
        hdr = ZSTD_MAGIC + bytes([0xE0]) + struct.pack("<Q", usize)
    bmax = min(ZSTD_BLOCK_MAX, usize)  # block size limit = min(window, 128 KiB)
    budget = csize - len(hdr)
    if budget < 4:
        return None
    for nraw in range(0, -(-budget // bmax) + 3):
        c = usize - budget + 3 * nraw
        nr0 = max(1 if nraw == 0 else 0, -(-c // (bmax - 4)) if c > 0 else 0)
        for n_rle in range(nr0, nr0 + 4):
            raw = budget - 3 * nraw - 4 * n_rle   # bytes carried by raw blocks
            rle = usize - raw                     # bytes produced by RLE blocks
            if raw < 0 or rle < 0:
                continue
            if (nraw == 0) != (raw == 0) or (n_rle == 0) != (rle == 0):
                continue
            if nraw and not nraw <= raw <= nraw * bmax:
                continue
            if n_rle and not n_rle <= rle <= n_rle * bmax:
                continue
            blocks = [(0, raw // nraw + (i < raw % nraw)) for i in range(nraw)]
            blocks += [(1, rle // n_rle + (i < rle % n_rle)) for i in range(n_rle)]
            out = bytearray(hdr)
            for j, (btype, bsize) in enumerate(blocks):
                last = 1 if j == len(blocks) - 1 else 0
                out += struct.pack("<I", last | (btype << 1) | (bsize << 3))[:3]
                out += bytes(bsize) if btype == 0 else b"\0"
            assert len(out) == csize
            return bytes(out)
    return None


# --------------------------------------------------------------------------
def plan_patches(m, containers, keep, keep_all_ptx, mode):
    """Return (patches, decisions). A patch is (file_offset, bytes) or
    (file_offset, int length) meaning `length` zero bytes."""
    patches, decisions = [], []
    for c in containers:
        kept = []
        for e in c["entries"]:
            keep_it = e["arch"] in keep or (keep_all_ptx and e["kind"] == 1)
            how = "keep" if keep_it else mode
            p = e["offset"] + e["header_size"]
            if not keep_it and mode == "stub":
                stub = None
                if e["flags"] & FLAG_ZSTD:
                    stub = zstd_zero_stub(e["data_size"], e["usize"])
                if stub is None:
                    # uncompressed payload (or no stub possible): zeros are the
                    # "decompressed" form anyway
                    how = "zero"
                    patches.append((p, e["payload_size"]))
                else:
                    patches.append((p, stub))
                    if e["payload_size"] > e["data_size"]:
                        patches.append((p + e["data_size"], e["payload_size"] - e["data_size"]))
            elif not keep_it and mode == "zero":
                patches.append((p, e["payload_size"]))
            decisions.append((e, keep_it, how))
            if keep_it:
                kept.append(e)
        if mode == "compact":
            first = c["offset"] + struct.unpack_from("<H", m, c["offset"] + 6)[0]
            blob = b"".join(m[e["offset"]:e["offset"] + e["header_size"] + e["payload_size"]]
                            for e in kept)
            old_len = c["end"] - first
            if len(blob) != old_len:
                patches.append((c["offset"] + 8, struct.pack("<Q", len(blob))))
                patches.append((first, blob))
                patches.append((first + len(blob), old_len - len(blob)))
    patches.sort(key=lambda pt: pt[0])
    for a, b in zip(patches, patches[1:]):
        la = a[1] if isinstance(a[1], int) else len(a[1])
        assert a[0] + la <= b[0], "overlapping patches"
    return patches, decisions


def plen(pt):
    return pt[1] if isinstance(pt[1], int) else len(pt[1])


def write_patched(m, patches, path):
    chunk = 16 << 20
    zero = bytes(chunk)
    with open(path, "wb") as out:
        pos = 0
        for (start, data) in patches + [(len(m), b"")]:
            while pos < start:
                k = min(chunk, start - pos)
                out.write(m[pos:pos + k])
                pos += k
            if isinstance(data, int):
                left = data
                while left:
                    k = min(chunk, left)
                    out.write(zero[:k])
                    left -= k
                pos += data
            else:
                out.write(data)
                pos += len(data)


def parse_at(m, off):
    magic, version, hsize, fsize = struct.unpack_from("<IHHQ", m, off)
    if magic != FATBIN_MAGIC:
        raise FormatError("no fatbin at 0x%x" % off)
    return parse_containers(m, off, off + hsize + fsize, "@0x%x" % off)[0]


def payload_digest(m, e):
    p = e["offset"]
    return hashlib.sha256(m[p:p + e["header_size"] + e["payload_size"]]).hexdigest()


def verify(m, o, secs, containers, decisions, patches, mode, zstd_mod):
    if len(o) != len(m):
        raise FormatError("output size differs")
    if read_sections(o) != secs:
        raise FormatError("section table differs")
    # 1. bytes outside the patched ranges are identical
    chunk = 16 << 20
    h_in, h_out = hashlib.sha256(), hashlib.sha256()
    pos = 0
    for (start, data) in patches + [(len(m), b"")]:
        while pos < start:
            k = min(chunk, start - pos)
            h_in.update(m[pos:pos + k])
            h_out.update(o[pos:pos + k])
            pos += k
        n = plen((start, data))
        if isinstance(data, int):
            if o[start:start + n].count(0) != n:
                raise FormatError("range at 0x%x should be zero" % start)
        elif o[start:start + n] != data:
            raise FormatError("patch at 0x%x not written" % start)
        pos = start + n
    if h_in.digest() != h_out.digest():
        raise FormatError("bytes outside the patched ranges differ")
    # 2. every container still parses at its original start; kept entries
    #    (header + payload) are byte-identical to the input
    kept_off = {e["offset"] for (e, keep_it, how) in decisions if keep_it}
    how_of = {e["offset"]: how for (e, keep_it, how) in decisions}
    dctx = zstd_mod.ZstdDecompressor() if zstd_mod is not None else None
    nkept = 0
    for c in containers:
        c2 = parse_at(o, c["offset"])
        want = [e for e in c["entries"] if e["offset"] in kept_off]
        if mode == "compact":
            if len(c2["entries"]) != len(want):
                raise FormatError("container 0x%x: %d entries, expected %d"
                                  % (c["offset"], len(c2["entries"]), len(want)))
            pairs = list(zip(want, c2["entries"]))
        else:
            if len(c2["entries"]) != len(c["entries"]):
                raise FormatError("container 0x%x: entry count changed" % c["offset"])
            for e, e2 in zip(c["entries"], c2["entries"]):
                if o[e2["offset"]:e2["offset"] + e2["header_size"]] != \
                   m[e["offset"]:e["offset"] + e["header_size"]]:
                    raise FormatError("entry header at 0x%x changed" % e["offset"])
                if dctx is not None and how_of[e["offset"]] == "stub":
                    p = e2["offset"] + e2["header_size"]
                    out = dctx.decompress(o[p:p + e2["data_size"]], max_output_size=e2["usize"])
                    if len(out) != e2["usize"] or out.count(0) != len(out):
                        raise FormatError("stub at 0x%x does not decompress to zeros" % p)
            pairs = [(e, e2) for e, e2 in zip(c["entries"], c2["entries"])
                     if e["offset"] in kept_off]
        for e, e2 in pairs:
            if payload_digest(m, e) != payload_digest(o, e2):
                raise FormatError("kept entry at 0x%x differs in output" % e["offset"])
            nkept += 1
    wr = check_wrappers(o, secs, [dict(offset=c["offset"]) for c in containers])
    if wr is not None and wr[1]:
        raise FormatError("host wrappers do not point at containers in the output")
    return nkept, h_out.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, help="input .so")
    ap.add_argument("--output", help="output .so (omit with --dry-run)")
    ap.add_argument("--keep-arch", type=int, nargs="+", default=[90],
                    help="SM numbers whose entries are kept (default: 90, which keeps "
                         "sm_90 and sm_90a)")
    ap.add_argument("--mode", choices=("compact", "stub", "zero"), default="compact",
                    help="how dropped entries are removed (see the module docstring); "
                         "default: compact")
    ap.add_argument("--keep-all-ptx", action="store_true",
                    help="keep PTX entries of every architecture (JIT fallback)")
    ap.add_argument("--dry-run", action="store_true", help="only print what would be done")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip re-reading the output to check it")
    ap.add_argument("--check-zstd", action="store_true",
                    help="needs the 'zstandard' module: decompress kept payloads and check "
                         "size/type; in stub mode also decompress every stub")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every entry")
    args = ap.parse_args()
    if not args.dry_run and not args.output:
        ap.error("--output is required unless --dry-run")
    if args.output and os.path.abspath(args.output) == os.path.abspath(args.input):
        ap.error("--output must differ from --input")
    keep = set(args.keep_arch)
    zstd_mod = None
    if args.check_zstd:
        try:
            import zstandard as zstd_mod
        except ImportError:
            print("--check-zstd: module 'zstandard' not available, skipped")

    with open(args.input, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    secs = read_sections(m)
    containers, stray = find_fatbins(m, secs)
    if not containers:
        print("no fatbin containers found; nothing to do", file=sys.stderr)
        return 1
    wr = check_wrappers(m, secs, containers)
    patches, decisions = plan_patches(m, containers, keep, args.keep_all_ptx, args.mode)

    stat = {}
    for i, (e, keep_it, how) in enumerate(decisions, 1):
        key = (e["arch"], e["label"], e["kind"])
        st = stat.setdefault(key, collections.Counter())
        st["kept" if keep_it else "dropped"] += 1
        st["kept_bytes" if keep_it else "dropped_bytes"] += e["payload_size"]
        if args.verbose:
            print("  #%-4d %-3s %-12s hdr@0x%09x hdr=%3d payload=%10d data=%10d "
                  "unc=%10d flags=0x%x %s" % (i, KIND_NAMES[e["kind"]], e["label"], e["offset"],
                                             e["header_size"], e["payload_size"],
                                             e["data_size"], e["usize"], e["flags"], how))
    nzero_entries = collections.Counter(how for _, k, how in decisions if not k)
    total_payload = sum(e["payload_size"] for c in containers for e in c["entries"])
    nonzero_written = sum(len(d) - d.count(0) for _, d in patches if not isinstance(d, int))
    print("input : %s (%d bytes)" % (args.input, len(m)))
    print("fatbin sections: %s; containers: %d; entries: %d; payload bytes: %d"
          % (", ".join(sorted({c["section"] for c in containers})), len(containers),
             len(decisions), total_payload))
    if wr is not None:
        print("host wrappers (.nvFatBinSegment): %d, %s" % (
            wr[0], "all point at parsed containers" if not wr[1] else "PROBLEMS: %r" % wr[1][:5]))
    if stray:
        print("WARNING: %d fatbin magic(s) outside parsed sections left untouched: %s"
              % (len(stray), ", ".join(hex(x) for x in stray[:10])))
    print("mode: %s; keep arch: %s%s" % (args.mode, sorted(keep),
                                          " + all PTX" if args.keep_all_ptx else ""))
    print("%-4s %-10s %6s %12s %7s %13s" % ("kind", "arch", "kept", "kept_bytes",
                                           "dropped", "dropped_bytes"))
    for (arch, label, kind), st in sorted(stat.items()):
        print("%-4s %-10s %6d %12d %7d %13d" % (KIND_NAMES[kind], label, st["kept"],
                                               st["kept_bytes"], st["dropped"],
                                               st["dropped_bytes"]))
    nk = sum(s["kept"] for s in stat.values())
    nd = sum(s["dropped"] for s in stat.values())
    dropped_bytes = sum(s["dropped_bytes"] for s in stat.values())
    print("total: kept %d entries (%d payload bytes); dropped %d entries (%d payload bytes, "
          "%.1f%% of the file) as %s" % (nk, total_payload - dropped_bytes, nd, dropped_bytes,
                                        100.0 * dropped_bytes / len(m), dict(nzero_entries)))
    print("bytes rewritten: %d (of which non-zero: %d)"
          % (sum(plen(p) for p in patches), nonzero_written))
    if nk == 0:
        print("ERROR: no entry would be kept; check --keep-arch", file=sys.stderr)
        return 2
    kept_off = {e["offset"] for (e, keep_it, how) in decisions if keep_it}
    empty = [c["offset"] for c in containers
             if not any(e["offset"] in kept_off for e in c["entries"])]
    if empty:
        print("WARNING: %d container(s) keep no entry at all (kernels of those translation "
              "units will have no image for the kept architectures): %s"
              % (len(empty), ", ".join(hex(x) for x in empty[:10])))
    else:
        print("every container keeps at least one entry")

    if zstd_mod is not None:
        d = zstd_mod.ZstdDecompressor()
        nchk = 0
        for (e, keep_it, how) in decisions:
            if not keep_it:
                continue
            p = e["offset"] + e["header_size"]
            if e["flags"] & FLAG_ZSTD:
                out = d.decompress(m[p:p + e["data_size"]], max_output_size=e["usize"])
                if len(out) != e["usize"]:
                    raise FormatError("entry 0x%x: decompressed %d bytes, header says %d"
                                      % (e["offset"], len(out), e["usize"]))
            else:  # stored uncompressed: data_size/usize are 0, payload_size is the size
                out = m[p:p + e["payload_size"]]
            if e["kind"] == 2 and out[:4] != b"\x7fELF":
                raise FormatError("entry 0x%x: payload is not an ELF" % e["offset"])
            nchk += 1
        print("check-zstd: %d kept payloads decompress to the stated size and type" % nchk)

    if args.dry_run:
        return 0

    tmp = args.output + ".tmp"
    write_patched(m, patches, tmp)
    shutil.copymode(args.input, tmp)
    if not args.no_verify:
        with open(tmp, "rb") as f:
            o = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            nkept, digest = verify(m, o, secs, containers, decisions, patches, args.mode,
                                   zstd_mod)
        except FormatError:
            os.unlink(tmp)
            raise
        print("verify: same size and section table; bytes outside the rewritten ranges "
              "identical; all %d containers parse at their original addresses; %d kept "
              "entries (header+payload) byte-identical%s"
              % (len(containers), nkept,
                 "; every stub decompresses to zeros" if args.mode == "stub" and zstd_mod
                 else ""))
    os.replace(tmp, args.output)
    print("wrote %s (%d bytes)" % (args.output, os.path.getsize(args.output)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except FormatError as ex:
        print("ERROR (no output written): %s" % ex, file=sys.stderr)
        sys.exit(3)
