#!/usr/bin/env bash
# The documentation check (tests/tools:check_docs_links_test runs it): README.md and every
# docs/*.md page must only link to what exists, and the README's commands must name what exists.
#   - Every relative link or image, [text](path) or [text](path#anchor), outside code (fenced
#     blocks and `inline code` are skipped), resolves against the linking file's directory to an
#     existing file or directory; an #anchor must be a heading of the .md page it names, as GitHub
#     spells anchors (lower case, punctuation other than - and _ dropped, spaces as -, a repeated
#     heading gets -1, -2, ...). Links with a scheme (https:, mailto:) are not checked.
#   - In README.md, every Bazel label //pkg:name (in commands, deps) and every bazel-bin/pkg/name
#     is a rule `name = "name"` of pkg/BUILD, and every tools/....sh script it runs exists.
# Prints each fault as "FILE:LINE: ..." and exits 1 if there is any; otherwise prints
# "docs links: OK (L links in F files, T README targets and scripts)" and exits 0.
#
#   tools/check_docs_links.sh [ROOT]   # ROOT: the repository to check (default: this script's)
#
# Cheap on purpose (bash + awk, no Bazel): the test gives it the pages, the README's BUILD files and
# scripts as data, so a page, target or script missing from the test's data reads as broken,
# never as checked.
set -uo pipefail
root=${1:-"$(dirname "$0")/.."}
cd "$root" || exit 2

files=(README.md)
while IFS= read -r f; do files+=("$f"); done < <(find docs -name '*.md' 2>/dev/null | LC_ALL=C sort)

# "LINE<TAB>TARGET" for every link of a markdown file that is outside code.
links_of() {
  awk '
    /^ *```/ { fence = !fence; next }
    fence { next }
    {
      # Drop inline code; a span may continue on the next line (in_code carries over).
      n = split($0, part, "`"); text = ""
      for (i = 1; i <= n; ++i) {
        if (!in_code) text = text part[i] " "
        if (i < n) in_code = !in_code
      }
      while (match(text, /\]\([^) ]+\)/)) {
        print NR "\t" substr(text, RSTART + 2, RLENGTH - 3)
        text = substr(text, RSTART + RLENGTH)
      }
    }' "$1"
}

# The anchors of a markdown file's headings, one a line, as GitHub makes them.
anchors_of() {
  awk '
    /^ *```/ { fence = !fence; next }
    fence || !/^#+ / { next }
    {
      h = tolower($0)
      sub(/^#+ +/, "", h); sub(/ +#* *$/, "", h)
      gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h)
      a = h
      if (h in seen) a = h "-" seen[h]
      ++seen[h]
      print a
    }' "$1"
}

faults=0
nlinks=0
fault() {
  echo "$1"
  faults=$((faults + 1))
}

for f in "${files[@]}"; do
  dir=$(dirname "$f")
  while IFS=$'\t' read -r line target; do
    nlinks=$((nlinks + 1))
    case "$target" in
      [a-zA-Z]*:*) continue ;;  # https:, mailto:, ...
    esac
    path=${target%%#*}
    anchor=
    [[ "$target" == *#* ]] && anchor=${target#*#}
    if [ -z "$path" ]; then
      resolved=$f
    elif [[ "$path" == /* ]]; then
      resolved=${path#/}
    else
      resolved=$dir/$path
    fi
    if [ ! -e "$resolved" ]; then
      fault "$f:$line: link to $target: no such file ($resolved)"
      continue
    fi
    if [ -n "$anchor" ] && [[ "$resolved" == *.md ]]; then
      if ! anchors_of "$resolved" | grep -qxF -- "$anchor"; then
        fault "$f:$line: link to $target: $resolved has no heading with anchor #$anchor"
      fi
    fi
  done < <(links_of "$f")
done

# The README's commands: Bazel labels, bazel-bin paths and scripts.
ntargets=0
while IFS=$'\t' read -r line ref; do
  ntargets=$((ntargets + 1))
  case "$ref" in
    //*)
      pkg=${ref#//}; pkg=${pkg%%:*}; name=${ref##*:} ;;
    bazel-bin/*)
      pkg=$(dirname "${ref#bazel-bin/}"); name=$(basename "$ref") ;;
    *)
      [ -f "$ref" ] || fault "README.md:$line: $ref: no such script"
      continue ;;
  esac
  if [ ! -f "$pkg/BUILD" ]; then
    fault "README.md:$line: $ref: no BUILD file $pkg/BUILD"
  elif ! grep -qE "^ *name = \"$name\"," "$pkg/BUILD"; then
    fault "README.md:$line: $ref is not a rule of $pkg/BUILD"
  fi
done < <(awk '{
    text = $0
    while (match(text, /(\/\/[a-z0-9_\/]+:[A-Za-z0-9_.-]+|bazel-bin\/[a-z0-9_\/]+|tools\/[a-z0-9_\/]+\.sh)/)) {
      print NR "\t" substr(text, RSTART, RLENGTH)
      text = substr(text, RSTART + RLENGTH)
    }
  }' README.md)

if [ "$faults" -gt 0 ]; then
  echo "docs links: $faults broken"
  exit 1
fi
echo "docs links: OK ($nlinks links in ${#files[@]} files, $ntargets README targets and scripts)"
