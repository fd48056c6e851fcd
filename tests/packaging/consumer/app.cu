// tests/packaging/consumer/app.cu: the consumer program compiled by nvcc: the host part of
// consumer.hpp, then the kernels (gpu_detect.cuh).
#include "consumer.hpp"
#include "gpu_detect.cuh"

int main() {
  if (run_consumer(DCR_CONSUMER_NAME) != 0) return 1;
  return run_gpu_detect(DCR_CONSUMER_NAME);
}
