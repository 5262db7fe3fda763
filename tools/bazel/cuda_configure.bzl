"""cuda_configure: the @cuda repository, from the machine's toolkit when it has one.

With /usr/local/cuda present, the repository is that directory (symlinked) with
third_party/cuda.BUILD. Without it, the repository holds the same targets, empty, so that the
workspace still loads; every target that needs them is skipped under --config=cpu (cuda.bzl's
cuda_only()), which tools/setup.sh selects on such a machine.
"""

_TOOLKIT = "/usr/local/cuda"

_TARGETS = ["headers", "cudart", "cublas", "cudnn", "nccl"]

def _cuda_configure_impl(ctx):
    toolkit = ctx.path(_TOOLKIT)
    if toolkit.exists:
        for entry in toolkit.readdir():
            ctx.symlink(entry, entry.basename)
        ctx.symlink(ctx.attr.build_file, "BUILD.bazel")
        return
    lines = [
        "# No CUDA toolkit at %s: empty stand-ins (build with --config=cpu)." % _TOOLKIT,
        'package(default_visibility = ["//visibility:public"])',
    ]
    for name in _TARGETS:
        lines.append('cc_library(name = "%s")' % name)
    ctx.file("BUILD.bazel", "\n".join(lines) + "\n")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    attrs = {"build_file": attr.label(allow_single_file = True)},
    local = True,
)
