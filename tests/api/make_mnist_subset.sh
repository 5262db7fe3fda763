# Sourced by the port tests: make_mnist_subset DIR TRAIN TEST writes the first TRAIN training and
# TEST test images and labels of Debian's Fashion-MNIST (the MNIST file format, which libtorch's
# MNIST dataset and the published examples read) into DIR as the four uncompressed IDX files,
# with the counts in their headers set to match. Returns 1 when the data set is not installed.
make_mnist_subset() {
  local out=$1 train=$2 test=$3 src=/usr/share/datasets/fashion-mnist
  [ -e "$src/train-images-idx3-ubyte.gz" ] || return 1
  mkdir -p "$out"
  local split n kind
  for split in train t10k; do
    n=$train
    [ "$split" = t10k ] && n=$test
    local count
    count=$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((n >> 24 & 255)) $((n >> 16 & 255)) \
      $((n >> 8 & 255)) $((n & 255)))
    # Images: magic, count, rows, cols, then 784 bytes each; labels: magic, count, 1 byte each.
    { gunzip -c "$src/$split-images-idx3-ubyte.gz" | head -c 4; printf "$count"
      gunzip -c "$src/$split-images-idx3-ubyte.gz" | tail -c +9 | head -c $((8 + n * 784)); } \
      > "$out/$split-images-idx3-ubyte"
    { gunzip -c "$src/$split-labels-idx1-ubyte.gz" | head -c 4; printf "$count"
      gunzip -c "$src/$split-labels-idx1-ubyte.gz" | tail -c +9 | head -c "$n"; } \
      > "$out/$split-labels-idx1-ubyte"
  done
}
