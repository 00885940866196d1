"""Files in and out, with te_assembly's guarantees in one place each: every surface (configs, import,
export, data, generate, train) reads and writes through these modules, so a new surface gets them too.

- ``read``: the one bounded reader (regular files only, size limits, symlinks kept inside the folder a
  file was given in, UTF-8 and JSON errors named, JSON depth limited);
- ``names``: the one path sanitiser (a name that becomes a file name stays one name);
- ``write``: the one atomic file writer;
- ``directory``: the one guarded directory writer (nothing lost: DEST never is or holds a source, a run
  or someone else's files; a crash leaves the old directory or the new one);
- ``ownership``: what in a directory te_assembly wrote; ``file_types``: what kind of file a path is.

Pure Python (no torch): the foundation layer, below everything else.
"""
