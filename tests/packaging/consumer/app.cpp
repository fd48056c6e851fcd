// tests/packaging/consumer/app.cpp: the consumer program as a C++ translation unit.
#include "consumer.hpp"

int main() { return run_consumer(DCR_CONSUMER_NAME); }
