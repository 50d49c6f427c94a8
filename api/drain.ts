export { POST } from '../functions/vercel/drain.js';
