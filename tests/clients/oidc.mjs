// A real OpenID Connect provider (npm oidc-provider) for tests/test_console_sso.py: one client, the
// console, with the secret and redirect URI given; any login name with the password "right-password"
// signs in as that account (preferred_username = the name). Usage: node oidc.mjs PORT CLIENT_SECRET REDIRECT_URI
import http from "node:http";
import Provider, { interactionPolicy } from "oidc-provider";

const [port, secret, redirect] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const policy = interactionPolicy.base();
policy.remove("consent"); // a first-party client: no consent screen (the grant is made below)

const provider = new Provider(issuer, {
  clients: [{ client_id: "console", client_secret: secret, redirect_uris: [redirect],
              grant_types: ["authorization_code"], response_types: ["code"] }],
  claims: { openid: ["sub"], profile: ["preferred_username", "name"], email: ["email"] },
  interactions: { policy, url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  features: { devInteractions: { enabled: false } },
  pkce: { required: () => true },
  async findAccount(ctx, id) {
    return { accountId: id, async claims() { return { sub: id, preferred_username: id, name: id, email: `${id}@example.test` }; } };
  },
  async loadExistingGrant(ctx) {
    const grant = new provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope("openid profile email");
    await grant.save();
    return grant;
  },
});
provider.proxy = false;

const form = (uid, error) => `<!doctype html><title>Sign in</title>${error ? `<p id="error">${error}</p>` : ""}
<form method="post" action="/interaction/${uid}/login"><input name="login" id="login"><input name="password" id="password" type="password"><button type="submit">Sign in</button></form>`;

const server = http.createServer(async (req, res) => {
  const match = req.url.match(/^\/interaction\/([^/?]+)(\/login)?/);
  if (!match) return provider.callback()(req, res);
  try {
    const details = await provider.interactionDetails(req, res);
    if (!match[2]) {
      res.setHeader("content-type", "text/html");
      return res.end(form(details.uid));
    }
    let body = "";
    for await (const chunk of req) body += chunk;
    const fields = new URLSearchParams(body);
    if (fields.get("password") !== "right-password") {
      res.statusCode = 401;
      res.setHeader("content-type", "text/html");
      return res.end(form(details.uid, "wrong password"));
    }
    await provider.interactionFinished(req, res, { login: { accountId: fields.get("login") } }, { mergeWithLastSubmission: false });
  } catch (err) {
    res.statusCode = 500;
    res.end(String(err));
  }
});
server.listen(Number(port), "127.0.0.1", () => console.log("ready"));
