# ruff: noqa  (a measuring script, kept as it ran)
import asyncio, sys, time, os, resource, multiprocessing as mp
import grpc, grpc.aio
from hetero.v1 import coordinator_pb2 as pb
from hetero.bench.loadgen import heartbeat_request


def ser(m):
    return m.SerializeToString()


REQ = pb.HeartbeatRequest.FromString
REP = pb.HeartbeatResponse.FromString


async def server_main(port_q, mode):
    async def unary(req, ctx):
        return pb.HeartbeatResponse()

    async def stream(it, ctx):
        async for req in it:
            yield pb.HeartbeatResponse()

    h = grpc.method_handlers_generic_handler(
        "t.T",
        {
            "U": grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=REQ, response_serializer=ser
            ),
            "S": grpc.stream_stream_rpc_method_handler(
                stream, request_deserializer=REQ, response_serializer=ser
            ),
        },
    )
    s = grpc.aio.server()
    s.add_generic_rpc_handlers((h,))
    port = s.add_insecure_port("127.0.0.1:0")
    await s.start()
    port_q.put(port)
    await s.wait_for_termination()


def server(port_q, mode):
    asyncio.run(server_main(port_q, mode))


async def client_main(port, mode, agents, dur, out_q):
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    U = ch.unary_unary("/t.T/U", request_serializer=ser, response_deserializer=REP)
    S = ch.stream_stream("/t.T/S", request_serializer=ser, response_deserializer=REP)
    lat = []
    end = time.time() + dur

    async def agent(i):
        import random

        await asyncio.sleep(random.random())
        nxt = time.time()
        if mode == "S":
            call = S()
        tick = 0
        while time.time() < end:
            tick += 1
            req = heartbeat_request("n%d" % i, 4, tick)
            t0 = time.perf_counter()
            if mode == "U":
                await U(req, timeout=5)
            else:
                await call.write(req)
                await call.read()
            lat.append(time.perf_counter() - t0)
            nxt += 1.0
            await asyncio.sleep(max(0, nxt - time.time()))
        if mode == "S":
            await call.done_writing()

    await asyncio.gather(*(agent(i) for i in range(agents)))
    out_q.put(len(lat))


def client(port, mode, agents, dur, out_q):
    asyncio.run(client_main(port, mode, agents, dur, out_q))


if __name__ == "__main__":
    mode = sys.argv[1]
    agents = int(sys.argv[2])
    dur = float(sys.argv[3])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    oq = ctx.Queue()
    sp = ctx.Process(target=server, args=(q, mode))
    sp.start()
    port = q.get()
    import psutil

    ps = psutil.Process(sp.pid)
    cs = [ctx.Process(target=client, args=(port, mode, agents // 2, dur, oq)) for _ in range(2)]
    for c in cs:
        c.start()
    time.sleep(2)
    s0 = sum(ps.cpu_times()[:2])
    c0 = sum(sum(psutil.Process(c.pid).cpu_times()[:2]) for c in cs)
    t0 = time.time()
    time.sleep(dur - 4)
    s1 = sum(ps.cpu_times()[:2])
    c1 = sum(sum(psutil.Process(c.pid).cpu_times()[:2]) for c in cs)
    t1 = time.time()
    n = sum(oq.get() for _ in cs)
    rate = agents  # calls/s
    print(
        f"{mode}: server {1e6 * (s1 - s0) / (t1 - t0) / rate:.0f} us/call ({(s1 - s0) / (t1 - t0):.2f} cores), clients {1e6 * (c1 - c0) / (t1 - t0) / rate:.0f} us/call, calls {n}"
    )
    sp.kill()
