# Source this before `pip install` (or scripts/build_llama_server.sh): compiler flags for the
# llama.cpp that llama-cpp-python builds from source for this machine's CPU (-march=native).
#
# Some virtual machines advertise Intel AMX (amx_tile in /proc/cpuinfo) and grant the kernel
# permission for it, yet stop on the first tile instruction: ggml's AMX matrix multiply then
# dies with SIGILL ("Illegal instruction") on the first decode. On x86-64 the AMX instructions
# are left out of the build; everything else -march=native finds (AVX-512, VNNI, ...) stays.
# Elsewhere, and with a compiler that lacks the flags, nothing changes.
_ws_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ "$(uname -m)" = "x86_64" ] && echo 'int main(void){return 0;}' | ${CC:-cc} $_ws_amx -x c -o /dev/null - 2>/dev/null; then
    export CFLAGS="${CFLAGS:+$CFLAGS }$_ws_amx"
    export CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }$_ws_amx"
fi
unset _ws_amx
