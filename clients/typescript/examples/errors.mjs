// Every error has a stable code.
import { connect, RefusedError, UnavailableError, TimeoutError, LostError, ClosedError, BadArgumentError } from 'baton-locks';

const servers = (process.env.BATON_SERVERS ?? '127.0.0.1:7373').split(',');
const client = connect(servers);
try {
  const grant = await client.acquire('job', { leaseMs: 30_000, waitMs: 0 }); // a try: now, or TimeoutError
  try {
    await client.acquire('job', { leaseMs: 30_000, waitMs: 0, limit: 3 }); // 'job' is a mutex (limit 1)
  } finally {
    await grant.release();
  }
} catch (e) {
  if (e instanceof RefusedError) console.log(`refused: ${e.reason}`); // limit-mismatch
  else if (e instanceof TimeoutError) console.log('not granted within the wait');
  else if (e instanceof UnavailableError) console.log(`no server answered: ${e.message}`);
  else if (e instanceof LostError || e instanceof ClosedError || e instanceof BadArgumentError) console.log(e.code);
  else throw e;
} finally {
  await client.close();
}
