/**
 * `outlive/otel`: outlive's spans and metrics through `@opentelemetry/api`
 * (`./instrument.ts`), and the queues' gauges on an app's meter
 * (`./metrics.ts`). Only this entry point's files import the API, an
 * optional peer: an app that does not import `outlive/otel` needs it
 * neither installed nor resolvable by its bundler.
 */
export * from './instrument.js';
export { observeQueues, type ObserveQueuesOptions, type QueueObserver } from './metrics.js';
