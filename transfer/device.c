/* SPDX-License-Identifier: MIT */
/*
 * transfer/device.c - device-backend code common to every build. Today only the stand-ins for
 * kvt_device_cuda_create(), kvt_device_cuda_batched() and kvt_device_cuda_copy_path() in
 * builds without CUDA, so that callers (the engine, tests, tools) link the same way in every
 * build and learn at run time that CUDA is absent.
 */
#include "tiers/base/error.h"
#include "transfer/device.h"

#ifndef KVT_WITH_CUDA
static int
device_no_cuda(void)
{
	return kvt_err(KVT_ENOTSUP, "built without CUDA (KVT_WITH_CUDA=OFF or nvcc not found)");
}

int
kvt_device_cuda_create(int ordinal, struct kvt_device **out)
{
	(void)ordinal;
	if (out != NULL)
		*out = NULL;
	return device_no_cuda();
}

int
kvt_device_cuda_batched(struct kvt_device *d)
{
	(void)d;
	return device_no_cuda();
}

int
kvt_device_cuda_copy_path(struct kvt_device *d, enum kvt_cuda_copy_path path,
			  uint64_t counts[KVT_CUDA_COPY_PATHS])
{
	(void)d;
	(void)path;
	(void)counts;
	return device_no_cuda();
}
#endif
