#include "client/commands.h"

int main(int argc, char** argv) { return mutwo::RunCli(argc, argv); }
