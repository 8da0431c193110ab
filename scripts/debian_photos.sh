#!/usr/bin/env bash
# Real photographs for `torchfeed bench --data DIR` and `torchfeed doctor --data DIR`: the JPEG
# wallpapers that Debian's mate-backgrounds, gnome-backgrounds and plasma-workspace-wallpapers
# ship, in an ImageFolder layout (DIR/backgrounds/*.jpg, DIR/plasma/*.jpg). Each Plasma wallpaper
# comes in many sizes (WIDTHxHEIGHT.jpg); only its largest is kept. README's "Real
# photographs" table was measured on this set (35 files on Debian 12: median 4.1 megapixels,
# up to 17.9, 10 progressive; gnome-backgrounds 43 ships no JPEG).
#
# Usage: scripts/debian_photos.sh DIR            downloads the packages (about 170 MB; needs
#                                                apt-get and dpkg-deb)
#        scripts/debian_photos.sh DIR --from ROOT  takes them already unpacked under ROOT
set -euo pipefail

usage="usage: scripts/debian_photos.sh DIR [--from ROOT]"
if [ $# -ne 1 ] && { [ $# -ne 3 ] || [ "$2" != "--from" ]; }; then
  echo "debian_photos.sh: $usage" >&2
  exit 2
fi
out=$1
if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then
  echo "debian_photos.sh: DIR ($out) exists and is not empty; give a new directory" >&2
  exit 2
fi
if [ $# -eq 3 ]; then
  root=$3
  if [ ! -d "$root/usr/share" ]; then
    echo "debian_photos.sh: --from $root holds no unpacked packages (no usr/share)" >&2
    exit 2
  fi
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get download mate-backgrounds gnome-backgrounds plasma-workspace-wallpapers)
  for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
  root=$work/root
fi

mkdir -p "$out/backgrounds" "$out/plasma"
# MATE's and GNOME's: every JPEG, named after its folder too (abstract-..., nature-...)
if [ -d "$root/usr/share/backgrounds" ]; then
  find "$root/usr/share/backgrounds" -type f -iname '*.jpg' | sort | while read -r f; do
    cp "$f" "$out/backgrounds/$(basename "$(dirname "$f")")-$(basename "$f")"
  done
fi
# Plasma: in each wallpaper's images folder (images, images_dark), the WIDTHxHEIGHT.jpg with the
# most pixels
if [ -d "$root/usr/share/wallpapers" ]; then
  find "$root/usr/share/wallpapers" -type d -name 'images*' | sort | while read -r d; do
    best=$(find "$d" -maxdepth 1 -type f -regex '.*/[0-9]+x[0-9]+\.jpg' -printf '%f\n' |
      awk -Fx '{split($2, h, "."); print $1 * h[1], $0}' | sort -n | tail -1 | cut -d' ' -f2)
    [ -n "$best" ] || continue
    name=$(basename "$(dirname "$(dirname "$d")")")
    cp "$d/$best" "$out/plasma/$name${d##*/images}.jpg"
  done
fi
echo "debian_photos.sh: $(find "$out" -name '*.jpg' | wc -l) JPEGs in $out"
