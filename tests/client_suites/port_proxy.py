"""Forward LISTEN_HOST:LISTEN_PORT to 127.0.0.1:TARGET_PORT (amqpstorm's suite only knows port 5672)."""
import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    server_reader, server_writer = await asyncio.open_connection("127.0.0.1", int(sys.argv[3]))
    await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))


async def main() -> None:
    server = await asyncio.start_server(handle, sys.argv[1], int(sys.argv[2]))
    async with server:
        await server.serve_forever()

asyncio.run(main())
