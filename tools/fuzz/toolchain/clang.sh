#!/bin/bash
# The compiler and linker of --config=fuzz: clang-14, minus the GCC-only flags that some BUILD
# files pass in their copts (clang rejects them as unknown arguments). Nothing else changes.
args=()
for arg in "$@"; do
  case "$arg" in
    -fvect-cost-model=*) ;;  # tensor/cpu, optim: GCC's vectoriser cost model
    *) args+=("$arg") ;;
  esac
done
exec /usr/bin/clang-14 "${args[@]}"
