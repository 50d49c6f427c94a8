export { POST } from '../functions/vercel/signal.js';
