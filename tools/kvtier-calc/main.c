/* SPDX-License-Identifier: MIT */
/* tools/kvtier-calc/main.c - kvtier-calc, the KV-cache capacity planner (see calc.h, cli.c). */
#include <stdio.h>

#include "calc.h"

int
main(int argc, char **argv)
{
	return kvc_cli(argc, argv, stdout, stderr);
}
