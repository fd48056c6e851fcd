// tests/packaging/consumer/kernels.cu: the kernels alone from a CUDA target (CMake's dcr::kernels).
#include "gpu_detect.cuh"

int main() { return run_gpu_detect(DCR_CONSUMER_NAME); }
