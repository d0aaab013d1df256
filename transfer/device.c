/* SPDX-License-Identifier: MIT */
/*
 * transfer/device.c - device-backend code common to every build. Today only the stand-ins for
 * kvt_device_cuda_create() and kvt_device_cuda_batched() in builds without CUDA, so that
 * callers (the engine, tests, tools) link the same way in every build and learn at run time
 * that CUDA is absent.
 */
#include "error.h"
#include "transfer/device.h"

#ifndef KVT_WITH_CUDA
int
kvt_device_cuda_create(int ordinal, struct kvt_device **out)
{
	(void)ordinal;
	if (out != NULL)
		*out = NULL;
	return kvt_err(KVT_ENOTSUP, "built without CUDA (KVT_WITH_CUDA=OFF or nvcc not found)");
}

int
kvt_device_cuda_batched(struct kvt_device *d)
{
	(void)d;
	return kvt_err(KVT_ENOTSUP, "built without CUDA (KVT_WITH_CUDA=OFF or nvcc not found)");
}
#endif
