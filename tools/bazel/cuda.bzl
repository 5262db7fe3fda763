"""cuda_library: compiles .cu files with the toolkit's nvcc and wraps them in a cc_library.

    load("//tools/bazel:cuda.bzl", "cuda_library")
    cuda_library(
        name = "axpy_kernel",
        srcs = ["axpy.cu"],
        hdrs = ["axpy.h"],
        deps = ["//tensor:core"],   # include paths and headers of cc deps reach nvcc
    )

Device code is generated for sm_90 (H100) plus compute_90 PTX so newer GPUs JIT it.
Each .cu file becomes one object; the result links into any cc_binary/cc_test.
"""

# The toolkit's own path: nvcc finds cicc, ptxas and its headers relative to where it really lives,
# so it must not run through a sandbox symlink. Keep in sync with @cuda in WORKSPACE.
_NVCC = "/usr/local/cuda/bin/nvcc"

_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler=-fPIC",
    "-gencode=arch=compute_90,code=[sm_90,compute_90]",
    "--expt-relaxed-constexpr",
    "-lineinfo",
]

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
    """A cc_library whose .cu sources are compiled by nvcc (sm_90 + PTX)."""
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:headers"],
        copts = copts,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        **kwargs
    )
