#!/usr/bin/env bash
# The C++ compiler tools/setup_env.sh builds mmcv's ops with (CXX=this): the first compile turns
# mmcv's common header (pytorch_cpp_helper.hpp, which includes torch's whole tensor API) into a
# GCC precompiled header with that compile's own flags; every op that includes it first then
# reads it instead of parsing torch's headers again (nms.cpp against torch 2.1: 8.4 s -> 1.9 s;
# docs/development.md). A file whose flags differ makes GCC ignore the precompiled header and
# parse the header text beside it: the same code either way. Anything that is not a compile
# (-v, the link) passes through unchanged.
#   CXX_WITH_PCH_DIR   a folder for the header and its .gch (required)
#   CXX_WITH_PCH_REAL  the compiler (default c++)
set -euo pipefail
real=${CXX_WITH_PCH_REAL:-c++}
dir=${CXX_WITH_PCH_DIR:?CXX_WITH_PCH_DIR must name a folder for the precompiled header}
header=pytorch_cpp_helper.hpp

compiles=0 source_dir=
for arg in "$@"; do
  case $arg in
    -c) compiles=1 ;;
    -I*) [ -f "${arg#-I}/$header" ] && source_dir=${arg#-I} ;;
  esac
done
if [ "$compiles" = 0 ] || [ -z "$source_dir" ]; then
  exec "$real" "$@"
fi

mkdir -p "$dir"
(
  flock 9
  if [ ! -f "$dir/$header.gch" ] && [ ! -f "$dir/failed" ]; then
    # This compile's flags, less its source, object and dependency file.
    flags=() skip=0
    for arg in "$@"; do
      if [ "$skip" = 1 ]; then skip=0; continue; fi
      case $arg in
        -o|-MF) skip=1 ;;
        -c|-MMD|-MD|*.cpp|*.cc|*.cxx) ;;
        *) flags+=("$arg") ;;
      esac
    done
    cp "$source_dir/$header" "$dir/$header"
    if "$real" "${flags[@]}" -x c++-header "$dir/$header" -o "$dir/$header.gch.tmp"; then
      mv "$dir/$header.gch.tmp" "$dir/$header.gch"
    else  # compile without it: slower, the same objects
      echo "cxx_with_pch: no precompiled header (see above); compiling without it" >&2
      touch "$dir/failed"
    fi
  fi
) 9>"$dir/lock"
exec "$real" -I"$dir" "$@"
