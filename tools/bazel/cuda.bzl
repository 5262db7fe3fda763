"""cuda_library: compiles .cu files with the toolkit's nvcc and wraps them in a cc_library.

    load("//tools/bazel:cuda.bzl", "cuda_library")
    cuda_library(
        name = "elementwise",
        srcs = ["elementwise.cu"],
        hdrs = ["kernels.h"],
        deps = ["//tensor:core"],   # include paths and headers of cc deps reach nvcc
    )

Device code: by default sm_90 machine code (H100/H200) plus compute_80 PTX, which the driver
compiles for any GPU from the A100 on (Ada, and newer architectures than Hopper). Another list:
--define=cuda_archs=sm_80,sm_89,sm_90,compute_90 (each sm_XY adds machine code for that GPU, each
compute_XY PTX for it and everything newer). Each .cu file becomes one object; the result links
into any cc_binary/cc_test.

A build without CUDA (--config=cpu, which tools/setup.sh selects on a machine without the
toolkit) skips every CUDA target: cuda_library and the cc_library targets that use the toolkit
carry target_compatible_with = cuda_only(), and whatever depends on them is skipped with them.
"""

# The toolkit's own path: nvcc finds cicc, ptxas and its headers relative to where it really lives,
# so it must not run through a sandbox symlink. Keep in sync with @cuda in WORKSPACE.
_NVCC = "/usr/local/cuda/bin/nvcc"

_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler=-fPIC",
    "--expt-relaxed-constexpr",
    "-lineinfo",
]

_DEFAULT_ARCHS = "sm_90,compute_80"

def _gencode_flags(archs):
    """-gencode flags for a comma-separated list of sm_XY (machine code) and compute_XY (PTX)."""
    flags = []
    for arch in [a.strip() for a in archs.split(",") if a.strip()]:
        if arch.startswith("sm_"):
            flags.append("-gencode=arch=compute_%s,code=%s" % (arch[3:], arch))
        elif arch.startswith("compute_"):
            flags.append("-gencode=arch=%s,code=%s" % (arch, arch))
        else:
            fail("--define=cuda_archs: '%s' is neither sm_XY nor compute_XY" % arch)
    if not flags:
        fail("--define=cuda_archs is empty")
    return flags

def cuda_only():
    """target_compatible_with for targets that need the CUDA toolkit: none under --config=cpu."""
    return select({
        "//tools/bazel:cpu_only": ["//tools/bazel:cuda_toolkit_present"],
        "//conditions:default": [],
    })

def _nvcc_objects_impl(ctx):
    cc_deps = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in cc_deps])
    include_flags = ["-I."]
    for c in cc_deps:
        for d in c.includes.to_list() + c.quote_includes.to_list():
            include_flags.append("-I" + d)
        for d in c.system_includes.to_list():
            include_flags.append("-isystem=" + d)
        for d in c.defines.to_list():
            include_flags.append("-D" + d)
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_nvcc/%s/%s.o" % (ctx.label.name, src.basename[:-len(".cu")]))
        args = ctx.actions.args()
        args.add_all(_NVCC_FLAGS)
        args.add_all(_gencode_flags(ctx.var.get("cuda_archs", _DEFAULT_ARCHS)))
        args.add_all(include_flags)
        args.add_all(ctx.attr.copts)
        args.add("-c", src)
        args.add("-o", obj)
        ctx.actions.run(
            executable = _NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc (see the module doc for the archs)."""
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:headers"],
        copts = copts,
        visibility = ["//visibility:private"],
        target_compatible_with = cuda_only(),
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        target_compatible_with = cuda_only(),
        **kwargs
    )
