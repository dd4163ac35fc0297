# The store tier: POST /<key> adds one to the key's count and answers it, GET /<key> answers it; both need
# the secret's token (403 without it).
import http.server, os
TOKEN = open(os.path.join(os.environ['SHOAL_SECRETS_DIR'], 'store_token')).read().strip()
counts = {}
class H(http.server.BaseHTTPRequestHandler):
    def answer(self, add):
        if self.headers.get('X-Token') != TOKEN:
            self.send_response(403)
            self.end_headers()
            return
        counts[self.path] = counts.get(self.path, 0) + add
        body = str(counts[self.path]).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.answer(1)
    def do_GET(self):
        self.answer(0)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('0.0.0.0', 7000), H).serve_forever()
