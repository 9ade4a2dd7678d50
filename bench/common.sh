# What the GPU-machine scripts share (sourced by side_by_side.sh and ablation.sh, from the
# repository root): the default workloads, checks of their inputs, the Vulkan loader, and a
# workload's --set arguments.

# The six workloads of docs/BENCHMARKS.md.
WORKLOADS=(smollm2_135m whisper_tiny_encoder resnet50 sd_unet_tiny smolvla_expert minilm_l6)

# Exits (status 2) unless $1 is an executable mgnc ($2: how to build it) and every later
# argument names a model in models/.
check_inputs() {
    local mgnc=$1 build=$2 name
    shift 2
    if [ ! -x "$mgnc" ]; then
        echo "error: no mgnc at $mgnc (build it with \`$build\` and copy it, or set MGNC)" >&2
        exit 2
    fi
    for name in "$@"; do
        if [ ! -f "models/$name.mgn" ]; then
            echo "error: no models/$name.mgn" >&2
            exit 2
        fi
    done
}

# The GPU machine's image has no Vulkan loader: unpack the .debs brought along in .gl/ (see
# shared/design/GPU.md), and point the loader at NVIDIA's ICD when it is there.
vulkan_loader() {
    local f nv_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
        if ls .gl/*.deb >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            for f in .gl/*.deb; do dpkg -x "$f" /; done
            ldconfig
        fi
    fi
    if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$nv_icd" ]; then export VK_DRIVER_FILES=$nv_icd; fi
}

# A model's --set arguments (SET_<name>), one per line.
sets_of() {
    local var="SET_$1"
    local kv
    for kv in ${!var:-}; do printf -- '--set\n%s\n' "$kv"; done
}
