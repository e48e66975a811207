"""An output folder's life: build in DIR/.partial, publish into DIR with manifest.json last.

A run never leaves a mixed or duplicated dataset behind:
- everything is written under DIR/.partial/ (work files in work/, the finished MDS in out/);
- publishing writes .partial/manifest.json, moves each entry of out/ into DIR, copies the
  manifest to DIR/manifest.json and deletes .partial. A manifest in DIR therefore means
  "complete", and a crash while publishing is finished by the next run;
- a re-run finds nothing (build), a manifest (complete: nothing to do unless --overwrite), or
  .partial: resumed when it was started with the same settings, else started over;
- bad input found mid-build (a UsageError) deletes .partial, since a re-run would fail the same way.
Only entries this tool writes are ever deleted; a folder holding anything else is refused.
"""

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from aogpt import UsageError
from aogpt.data_prep.manifest import FILENAME, FORMAT, write_manifest

PARTIAL = ".partial"
SETTINGS = "settings.json"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


class OutputDir:
    """DIR and its DIR/.partial; `owns(name)` says which entries of DIR this tool writes."""

    def __init__(self, root: str | Path, owns: Callable[[str], bool]):
        self.root = Path(root)
        self.partial = self.root / PARTIAL
        self.work = self.partial / "work"  # scratch files, deleted when published
        self.out = self.partial / "out"  # what publish() moves into DIR
        self._owns = owns
        self._created_root = False

    def start(self, settings: dict, overwrite: bool) -> bool:
        """Makes .partial ready for a build with `settings`; False when DIR holds that build.

        `settings` is everything the output depends on (inputs, options, tool version).
        """
        settings = json.loads(json.dumps(settings))  # the form it has when read back
        entries = self._entries()
        if FILENAME in entries and PARTIAL in entries:  # a crash in publishing's very last step
            shutil.rmtree(self.partial)
            entries.remove(PARTIAL)
        has_manifest, has_partial = FILENAME in entries, PARTIAL in entries
        ours = [name for name in entries if name not in (FILENAME, PARTIAL)]
        if has_partial and not overwrite and self._saved_settings() == settings:
            if (self.partial / FILENAME).is_file():
                print(f"finishing the interrupted publishing of {self.root}")
                self._publish()
                return False
            print(f"resuming the interrupted build in {self.partial}")
            return True
        if has_manifest and not has_partial and not overwrite:
            if json.loads((self.root / FILENAME).read_text()).get("settings") != settings:
                raise UsageError(f"{self.root} holds a finished dataset built with other "
                                 f"settings or inputs: pass --overwrite to rebuild it, or choose "
                                 f"another folder")
            return False
        if has_partial:
            print(f"starting over: {self.partial} was made by a run with other settings"
                  if not overwrite else f"--overwrite: removing {self.partial}")
        elif ours and not has_manifest and not overwrite:
            raise UsageError(
                f"output folder {self.root} holds {ours[0]!r} but no {FILENAME} (an unfinished "
                f"build of another tool or version?): pass --overwrite to rebuild it there"
            )
        for name in entries:
            _remove(self.root / name)
        self.work.mkdir(parents=True)
        self.out.mkdir()
        (self.partial / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")
        return True

    def publish(self, manifest: dict) -> None:
        """Moves the finished datasets into DIR and writes DIR/manifest.json last.

        The manifest keeps the build's settings, so that a later run can tell "already done"
        from "asked for something else".
        """
        write_manifest(self.partial / FILENAME, {**manifest, "settings": self._saved_settings()})
        self._publish()

    def discard(self) -> None:
        """Removes everything this run wrote (after bad input: no partial output is left)."""
        if self.partial.exists():
            shutil.rmtree(self.partial)
        if self._created_root and not any(self.root.iterdir()):
            self.root.rmdir()

    def _publish(self) -> None:
        for entry in sorted(self.out.iterdir()):
            target = self.root / entry.name
            if target.exists():  # moved before a crash, or a stale leftover of that crash
                _remove(target)
            os.replace(entry, target)
        write_manifest(self.root / FILENAME, json.loads((self.partial / FILENAME).read_text()))
        shutil.rmtree(self.partial)

    def _entries(self) -> list[str]:
        """DIR's entries after checking that each one is this tool's (DIR is created if missing)."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"output {self.root} is a file, not a folder: choose a folder path")
        if not self.root.exists():
            self.root.mkdir(parents=True)
            self._created_root = True
        entries = sorted(os.listdir(self.root))
        foreign = [name for name in entries
                   if name not in (FILENAME, PARTIAL) and not self._owns(name)]
        if foreign:
            raise UsageError(f"output folder {self.root} holds {foreign[0]!r}, which this tool did "
                             f"not write: choose an empty or new folder")
        if FILENAME in entries and not self._is_our_manifest(self.root / FILENAME):
            raise UsageError(f"output folder {self.root} holds a {FILENAME} that is not an aogpt "
                             f"data manifest: choose an empty or new folder")
        return entries

    def _saved_settings(self) -> dict | None:
        try:
            return json.loads((self.partial / SETTINGS).read_text())
        except (OSError, json.JSONDecodeError):
            return None

    @staticmethod
    def _is_our_manifest(path: Path) -> bool:
        try:
            return json.loads(path.read_text()).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            return False
