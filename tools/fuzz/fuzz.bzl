"""fuzz_target: the targets of one reader's fuzzer (see tools/fuzz/BUILD).

    fuzz_target(name = "idx", deps = ["//dataset:idx"])

defines, from idx_fuzzer.cc and corpus/idx/:
    :idx_fuzzer_lib  the LLVMFuzzerTestOneInput library (alwayslink: a libFuzzer main finds it)
    :idx_fuzzer      the binary: libFuzzer under --config=fuzz, standalone_main.cc otherwise
    :idx_corpus      the seed files
"""

def fuzz_target(name, deps):
    native.cc_library(
        name = name + "_fuzzer_lib",
        srcs = [name + "_fuzzer.cc"],
        deps = deps + [":fuzz_util"],
        alwayslink = 1,
    )
    native.cc_binary(
        name = name + "_fuzzer",
        deps = [":" + name + "_fuzzer_lib"] + select({
            ":fuzzing": [],
            "//conditions:default": [":standalone_main"],
        }),
        linkopts = select({
            ":fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.filegroup(
        name = name + "_corpus",
        srcs = native.glob(["corpus/" + name + "/*"]),
    )
