// A lock around a job, fenced with its token.
import { connect, TimeoutError } from 'baton-locks';

const servers = (process.env.BATON_SERVERS ?? '127.0.0.1:7373').split(',');
const client = connect(servers);
try {
  // Wait up to 10 s in line; the lease (30 s) is kept alive in the background
  // while the job runs, and the key is released when it returns.
  await client.withLock('nightly-report', { leaseMs: 30_000, waitMs: 10_000 }, async (grant) => {
    console.log(`got it, token ${grant.token}`);
    // Hand the token to the store, which refuses tokens not above the last
    // one it accepted; pass grant.signal to work that must stop if the key is lost.
    await writeReport(grant.token, grant.signal);
  });
} catch (e) {
  if (e instanceof TimeoutError) console.log('someone else is running it');
  else throw e;
} finally {
  await client.close();
}

async function writeReport(token, signal) {
  signal.throwIfAborted();
}
