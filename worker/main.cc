#include "worker/cli.h"

int main(int argc, char** argv) { return mutwo::RunWorkerCli(argc, argv); }
