"""The floor of the burst benchmark: a controller that does nothing but create each TrainingJob's children.

    python bench/operator_scale/floor.py --kubeconfig K --namespace NS [--workers 16]

Watches TrainingJobs and, for each new one, creates exactly the objects the operator creates for its first
attempt -- claim, ConfigMap, ServiceAccount and Role, then the RoleBinding, then the RayJob, built by the
operator's own pure builders (``children.desired_children``) and sent with the operator's own client as
the same ServiceAccount -- and nothing else: no status, no Events, no reads. The time from a burst's POSTs
to its RayJobs under this controller is what the apiserver, etcd and the machine allow; ``run.py
--variant floor`` measures it beside the operator, and the operator's p99 is reported as a ratio to it.

Not an operator: no restarts, no deletion, no retries beyond the client's own. It exists only here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import ssl
from typing import Any

import aiohttp

from trainop.controller import children, kinds, kube, reconcile

log = logging.getLogger("floor")


async def create_children(client: kube.Kube, body: dict[str, Any]) -> None:
    manifests = children.desired_children(kinds.parse(body), 1)
    for wave in reconcile.CREATION_WAVES:
        batch = [m for m in manifests if m["kind"] in wave]
        await asyncio.gather(
            *(client.create(kube.BY_KIND[m["kind"]], m["metadata"]["namespace"], m) for m in batch)
        )


async def watch_owners(kubeconfig: str, namespace: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
    configuration = await kube.load_configuration(kubeconfig)
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    token = configuration.api_key.get("BearerToken") or configuration.api_key.get("authorization") or ""
    headers = {"Authorization": token if " " in token else f"Bearer {token}"}
    url = f"{configuration.host}/apis/trainop.dev/v1alpha1/namespaces/{namespace}/trainingjobs?watch=true"
    timeout = aiohttp.ClientTimeout(total=None)
    resource_version = ""
    announced = False
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        # The apiserver may end a watch (a slow reader under load): watch again from the last event seen.
        while True:
            since = f"&resourceVersion={resource_version}" if resource_version else ""
            async with session.get(url + since, ssl=context) as response:
                if not announced:
                    log.info("watching")  # run.py waits for this line
                    announced = True
                async for line in response.content:
                    event = json.loads(line)
                    if event["type"] == "ADDED":
                        await queue.put(event["object"])
                    if event["type"] != "ERROR":
                        resource_version = event["object"]["metadata"]["resourceVersion"]
            log.info("watch ended after resourceVersion %s; watching again", resource_version)


async def main(kubeconfig: str, namespace: str, workers: int) -> None:
    client = await kube.Kube.connect(kubeconfig)
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def work() -> None:
        while True:
            body = await queue.get()
            try:
                await create_children(client, body)
            except Exception as error:  # a floor measurement logs and goes on
                log.warning("%s: %s", body["metadata"]["name"], error)

    tasks = [asyncio.create_task(work()) for _ in range(workers)]
    try:
        await watch_owners(kubeconfig, namespace, queue)
    finally:
        for task in tasks:
            task.cancel()
        await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main(args.kubeconfig, args.namespace, args.workers))
