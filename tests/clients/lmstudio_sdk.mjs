// LM Studio's TypeScript SDK (@lmstudio/sdk) against serve: what each call answered, as one JSON object on stdout
// (the SDK's warnings about messages it could not read go to stderr). Usage: node lmstudio_sdk.mjs ws://HOST:PORT PROMPT
import { LMStudioClient } from "@lmstudio/sdk";

const [baseUrl, prompt] = process.argv.slice(2);
const client = new LMStudioClient({ baseUrl });
const model = await client.llm.model("tiny");
const info = await model.getModelInfo();
const whole = await model.respond(prompt, { maxTokens: 16 });
const fragments = [];
for await (const fragment of model.respond(prompt, { maxTokens: 16 })) fragments.push(fragment);
console.log(JSON.stringify({
  loaded: (await client.llm.listLoaded()).map((m) => m.identifier),
  downloaded: (await client.system.listDownloadedModels()).map((m) => m.modelKey),
  info: { modelKey: info.modelKey, contextLength: info.contextLength, format: info.format },
  tokens: await model.tokenize(prompt),
  content: whole.content,
  stats: whole.stats,
  fragments,
  completion: (await model.complete(prompt, { maxTokens: 8 })).content,
}));
process.exit(0);
