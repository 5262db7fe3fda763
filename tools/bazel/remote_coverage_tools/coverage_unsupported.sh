#!/bin/sh
echo "tapegrad: coverage collection is not supported by the offline Bazel setup" >&2
exit 1
