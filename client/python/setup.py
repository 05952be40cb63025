"""Build hook of the Loom client: generates loom/v1/*_pb2*.py from the .proto files.

The stubs are generated at build time, never committed, so they always match the proto/ of the
tree being installed. The .proto files are looked for, in order, in:
  1. $LOOM_PROTO_DIR (a folder holding loom/v1/*.proto),
  2. proto/ beside this file (where an sdist of this package carries them),
  3. proto/ of the repository two levels up (pip builds a local folder in place, so
     `pip install ./client/python` finds the repository's own).
The generated code is written into the build tree (into src/ for an editable install).
"""

import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_SUBDIR = os.path.join("loom", "v1")


def find_proto_root():
    """Returns the folder that holds loom/v1/*.proto, or raises with what was searched."""
    candidates = []
    if os.environ.get("LOOM_PROTO_DIR"):
        candidates.append(os.environ["LOOM_PROTO_DIR"])
    candidates.append(os.path.join(HERE, "proto"))
    candidates.append(os.path.join(HERE, "..", "..", "proto"))
    for root in candidates:
        if glob.glob(os.path.join(root, PROTO_SUBDIR, "*.proto")):
            return os.path.abspath(root)
    raise RuntimeError(
        "loom-client: no loom/v1/*.proto found in " + ", ".join(candidates) +
        "; build from a Loom checkout (pip install ./client/python) or set LOOM_PROTO_DIR to "
        "the repository's proto/ folder")


def generate_stubs(out_dir):
    """Runs grpc_tools.protoc over every loom/v1/*.proto, writing loom/v1/ under out_dir."""
    import grpc_tools
    from grpc_tools import protoc

    root = find_proto_root()
    protos = sorted(glob.glob(os.path.join(root, PROTO_SUBDIR, "*.proto")))
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    os.makedirs(os.path.join(out_dir, PROTO_SUBDIR), exist_ok=True)
    args = [
        "grpc_tools.protoc", "-I" + root, "-I" + well_known, "--python_out=" + out_dir,
        "--pyi_out=" + out_dir, "--grpc_python_out=" + out_dir
    ] + protos
    if protoc.main(args) != 0:
        raise RuntimeError("loom-client: grpc_tools.protoc failed on " + " ".join(protos))


class BuildPyWithStubs(build_py):
    """build_py that also generates the protobuf and gRPC modules."""

    def run(self):
        super().run()
        generate_stubs(os.path.join(HERE, "src") if self.editable_mode else self.build_lib)


class SdistWithProtos(sdist):
    """sdist that carries the .proto files, so that the sdist builds outside the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = find_proto_root()
        dest = os.path.join(base_dir, "proto", PROTO_SUBDIR)
        os.makedirs(dest, exist_ok=True)
        for proto in glob.glob(os.path.join(root, PROTO_SUBDIR, "*.proto")):
            shutil.copy(proto, dest)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos})
