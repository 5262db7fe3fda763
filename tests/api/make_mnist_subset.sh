# Sourced by the port tests: make_mnist_subset DIR TRAIN TEST writes the first TRAIN training and
# TEST test images and labels of Debian's Fashion-MNIST (the MNIST file format, which libtorch's
# MNIST dataset and the published examples read) into DIR as the four uncompressed IDX files,
# with the counts in their headers set to match. Returns 1 when the data set is not installed,
# 2 when a file could not be written whole (each file's size is checked).
make_mnist_subset() {
  local out=$1 train=$2 test=$3 src=/usr/share/datasets/fashion-mnist
  [ -e "$src/train-images-idx3-ubyte.gz" ] || return 1
  mkdir -p "$out" || return 2
  local split n kind item full count
  for split in train t10k; do
    n=$train
    [ "$split" = t10k ] && n=$test
    count=$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((n >> 24 & 255)) $((n >> 16 & 255)) \
      $((n >> 8 & 255)) $((n & 255)))
    # Images: magic, count, rows, cols, then 784 bytes each; labels: magic, count, 1 byte each.
    # Whole files first, then cut (no pipe is closed early, so no SIGPIPE can cut a file short).
    for kind in images labels; do
      full="$out/$split-$kind.full"
      gunzip -c "$src/$split-$kind-idx$([ $kind = images ] && echo 3 || echo 1)-ubyte.gz" \
        > "$full" || return 2
      local header=8 item=1
      [ "$kind" = images ] && header=16 && item=784
      local target="$out/$split-$kind-idx$([ $kind = images ] && echo 3 || echo 1)-ubyte"
      { head -c 4 "$full"; printf "$count"; tail -c +9 "$full" | head -c $((header - 8 + n * item)); } \
        > "$target" 2>/dev/null
      rm -f "$full"
      [ "$(stat -c %s "$target")" -eq $((header + n * item)) ] || return 2
    done
  done
  return 0
}
